"""torchft's replica groups at the head (issue 39 §2, ``--replica_groups``): what the nodes tell of their groups'
restarts, kept for the job's record. The request and its refusals are ``xrun.runner.replica_options``; the node
half is ``xrun.launch.replicas``."""
