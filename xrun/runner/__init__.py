"""Head-node layer: command line -> hostfile -> selection -> world -> plan -> backend."""
