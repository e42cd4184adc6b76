"""A run's directory as every process of the run sees it (the driver, verl's Ray workers): the
names of its files, the server key file kept in it, the checkpoints' completeness marker.
Standard library only."""
