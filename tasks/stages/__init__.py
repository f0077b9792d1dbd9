"""Pipeline stages run outside Prefect: the DVC `prepare` stage's script."""
