"""The application layer the `layerwise` CLI and the Prefect tasks share.

A strategy by its name, the cost model a run is priced with, the rule for reusing a saved
profile, the typed options of a training run and the torchrun job that trains it (checks, run
folder, launch with a deadline, the failure line). Plain functions and pydantic models that
report progress through callables, so that the CLI draws them on a terminal and the tasks log
them to Prefect; nothing here prints.
"""
