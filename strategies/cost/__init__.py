"""The cost of a strategy: Eq. 1 (cost_model), its vectorised tables, the t_c sources and the
measured profile."""
