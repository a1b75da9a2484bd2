"""The network check's head side: find the slow or unreachable node before a job does (issue 24), standing alone
(``xrun check --network``) or before every attempt of a job (``--precheck``).

Pure in the middle: ``rounds`` plans the pairwise rounds (DLRover's scheme); ``node_verdicts`` names each node ok,
slow or unreachable from literal figures; ``coordinate`` runs the rounds and settles failures (``Check``), against
any ``Prober`` or one batch at a time (``Stepper``); ``node_results`` holds each node's row, prints the table or the
JSON, and carries a precheck's result as data. ``probe_requests`` is how a request reaches a node and how its answer
comes back, for both ways of asking:

* ``xrun check --network``: ``check_command`` (its bad input and wiring) starts one probe process per node over ssh
  (``ssh_probes``) and prints;
* ``--precheck``: ``precheck_channel`` drives the check over the job's connected agents on the control server's loop,
  and ``precheck_decision`` is the one decision about what a bad node means (the job ends, or hot spares take bad
  nodes' places). What the job then does is its own rule (``xrun.runner.job.machine``).

The node side is ``xrun.launch.network``. Below ``xrun.runner.job`` in the head's layers, never importing it: the
job's server starts the precheck with callables (send, a timer, whether the job stops, where the result goes), and
the decision is network data (``NodesBad``, ``Replacing``) that the job's rule turns into its failure or seated
spares.
"""
