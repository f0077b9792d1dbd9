"""The Strategy contract: one ParallelConfig per layer, as JSON that `layerwise train` takes, and
the layers whose forward the backward recomputes instead of keeping what it saved."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator

from layerwise.strategies.breakdown import Breakdown
from layerwise.strategies.errors import ConfigError
from layerwise.strategies.execution import LayerwiseExecution
from layerwise.strategies.files.atomic import read_json_model, write_atomic
from layerwise.strategies.model.graph import LayerGraph
from layerwise.strategies.model.space import ParallelConfig, check_config, config_text
from layerwise.strategies.schedules import Execution
from layerwise.strategies.text import Name

SCHEMA_VERSION = 1


class LayerChoice(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    config: str  # compact text form, e.g. "n4c1h2w1@0-7"


class Strategy(BaseModel):
    """A strategy for one model structure, batch and device count, with its predicted cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = SCHEMA_VERSION
    name: Name
    model: Name
    structure_hash: str
    input_shape: tuple[int, ...]
    devices: int
    cluster: str
    cost_source: str
    layers: tuple[LayerChoice, ...]
    predicted: Breakdown
    execution: Execution = LayerwiseExecution()  # the engine that runs it and its schedule
    # layers whose tile forward runs again in the backward, so that what its ops save for the
    # backward is not held from the forward on (files from before read as none)
    recompute: tuple[str, ...] = ()

    @field_validator("layers")
    @classmethod
    def _each_layer_once(cls, layers: tuple[LayerChoice, ...]) -> tuple[LayerChoice, ...]:
        """A layer listed twice has two configs, and which one runs would be a guess."""
        twice = [name for name, count in Counter(c.name for c in layers).items() if count > 1]
        if twice:
            raise ValueError(f"layer '{twice[0]}' is listed more than once; give each layer "
                             "one config")
        return layers

    @field_validator("recompute")
    @classmethod
    def _recompute_once(cls, recompute: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(recompute)))

    @classmethod
    def from_assignment(cls, name: str, graph: LayerGraph, devices: int, cluster: str,
                        cost_source: str, assignment: dict[str, ParallelConfig],
                        predicted: Breakdown,
                        execution: Execution | None = None,
                        recompute: Collection[str] = ()) -> Strategy:
        return cls(
            name=name, model=graph.model, structure_hash=graph.structure_hash,
            input_shape=graph.input_shape, devices=devices, cluster=cluster,
            cost_source=cost_source,
            layers=tuple(LayerChoice(name=layer.name,
                                     config=config_text(layer, assignment[layer.name]))
                         for layer in graph.layers),
            predicted=predicted, execution=execution or LayerwiseExecution(),
            recompute=tuple(recompute),
        )

    def assignment(self) -> dict[str, ParallelConfig]:
        return {choice.name: ParallelConfig.parse(choice.config) for choice in self.layers}

    def check_against(self, graph: LayerGraph, devices: int) -> dict[str, ParallelConfig]:
        """The per-layer configs, after checking they fit `graph` on `devices` devices."""
        if self.structure_hash != graph.structure_hash:
            raise ConfigError(
                f"strategy '{self.name}' was made for {self.model} with structure "
                f"{self.structure_hash}, not {graph.model} ({graph.structure_hash}); run "
                "layerwise search again for this model and input size"
            )
        assignment = self.assignment()
        names = {layer.name for layer in graph.layers}
        unknown = sorted(set(assignment) - names)
        missing = [layer.name for layer in graph.layers if layer.name not in assignment]
        if unknown or missing:
            raise ConfigError(
                f"strategy '{self.name}' does not match the model's layers: unknown "
                f"{unknown[:5]}, missing {missing[:5]}"
            )
        for layer in graph.layers:
            check_config(layer, assignment[layer.name], devices)
        if self.recompute and not isinstance(self.execution, LayerwiseExecution):
            raise ConfigError(
                f"strategy '{self.name}' recomputes layers, which only the layer-wise executor "
                f"does, not its {self.execution.kind} engine; drop \"recompute\" from the file")
        check_recompute(graph, self.recompute)
        return assignment

    def save(self, path: str | Path) -> Path:
        return write_atomic(path, self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Strategy:
        return read_json_model(cls, path, "strategy file",
                               "write one with `layerwise search ... --save FILE`",
                               error=ConfigError)


def check_recompute(graph: LayerGraph, recompute: Collection[str]) -> None:
    """ConfigError unless every layer named can be recomputed: a layer of `graph` that computes
    (not the input) and is not the output, whose scores the loss reads in the forward."""
    names = {layer.name for layer in graph.layers}
    unknown = sorted(set(recompute) - names)
    if unknown:
        raise ConfigError(f"recompute names layer(s) the model does not have: "
                          f"{', '.join(unknown[:5])}")
    for name in recompute:
        if graph.by_name[name].kind == "input":
            raise ConfigError(f"recompute names the input '{name}', which has no forward; "
                              "drop it from the list")
        if name in graph.outputs:
            raise ConfigError(f"recompute names the output layer '{name}', whose scores the "
                              "loss reads in the forward; drop it from the list")
