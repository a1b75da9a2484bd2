"""torchft's replica groups on the node (issue 39 §2, ``--replica_groups``): ``lighthouse`` runs torchft's
Lighthouse on node 0 for the whole job, restarted when it dies. Each group's store is the store's
(``xrun.launch.store.agent_store``); each rank's group contract is planned on the head (``xrun.common.rankplan``).
"""
