"""V-trace actor-critic (IMPALA, Espeholt et al. 2018) on replayed unrolls, categorical actors."""
