"""layerwise's domain core: model zoo, layer graph, configuration space, cluster specs.

Imports torch, numpy and pydantic only, so it also runs on a bare GPU box (DESIGN.md section 2).
"""
