"""`layerwise train` on two machines, played by two launchers on this one: `--nnodes 2
--node-rank 0|1 --rdzv-endpoint 127.0.0.1:PORT`, one process each, one shared run folder.

The run equals one process's training on the same global batches; a node that dies ends the
other as soon as gloo sees the connection closed (long before the collective timeout), with
the dead node named. Node 0's launcher listens for the others on the endpoint's address alone;
a node waiting for the others says so. A node's place or node 0's address given wrong is one
line before anything is written.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from typer.testing import CliRunner

from layerwise.flows.cli import app
from layerwise.strategies.exactness.reference import compare, reference_run
from layerwise.strategies.training_run import RunResult, TrainSettings
from tests.distributed import free_port
from tests.processes import (
    as_from_a_terminal,
    kill_tree,
    listening_addresses,
    processes_mentioning,
    torchrun_child,
)

LAYERWISE = Path(sys.executable).parent / "layerwise"
TWO_NODES = ("tiny_cnn", "--strategy", "data", "--nproc", "1", "--nnodes", "2", "--image-size",
             "8", "--batch-per-device", "4")
WAIT_SECONDS = 180  # two launchers on two cores start in ~30 s; reached only on a hang
FLOAT32_ROUNDING = 1e-5  # 4 float32 steps: ~4e-7 from the summation order; an error: > 1e-3


def _node(rank: int, endpoint: str, out: Path, *args: str) -> list[str]:
    """The arguments of node `rank`'s `layerwise train`."""
    return ["train", *TWO_NODES, *args, "--out", str(out), "--node-rank", str(rank),
            "--rdzv-endpoint", endpoint]


def _start(arguments: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([str(LAYERWISE), *arguments], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(nodes: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    """Each node's exit code, stdout and stderr; whatever is left goes if one hangs."""
    try:
        outputs = [node.communicate(timeout=WAIT_SECONDS) for node in nodes]
    finally:
        for node in nodes:
            kill_tree(node)
    return [(node.returncode, *output) for node, output in zip(nodes, outputs, strict=True)]


@pytest.mark.parametrize("args, message", [
    (("--nnodes", "2", "--rdzv-endpoint", "h:1"), "several nodes need --node-rank"),
    (("--nnodes", "2", "--node-rank", "0"), "several nodes need --node-rank"),
    (("--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"),
     "--node-rank must be 0..1 for --nnodes 2 (got 2)"),
    (("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "nosuch.invalid:29500"),
     "--rdzv-endpoint nosuch.invalid:29500: 'nosuch.invalid' does not resolve"),
    (("--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1"),
     "--rdzv-endpoint '127.0.0.1' is not HOST:PORT"),
    (("--node-rank", "0", "--rdzv-endpoint", "h:1"), "are for --nnodes > 1"),
])
def test_a_node_misplaced_is_one_line_and_no_folder(tmp_path, args, message):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "tiny_cnn", "--strategy", "data", "--nproc", "1",
                                      *args, "--out", str(out)])
    assert result.exit_code == 2 and message in _one_line(result.stderr), result.output
    assert not out.exists()


def test_nodes_without_a_shared_folder_are_refused():
    result = CliRunner().invoke(app, ["train", "tiny_cnn", "--strategy", "data", "--nproc", "1",
                                      "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint",
                                      "127.0.0.1:1"])
    assert result.exit_code == 2 and "pass --out DIR" in _one_line(result.stderr)


def test_node_0_that_cannot_listen_at_its_endpoint_is_one_line(tmp_path):
    with socket.socket() as taken:  # another program holds the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        endpoint = f"127.0.0.1:{taken.getsockname()[1]}"
        result = CliRunner().invoke(app, _node(0, endpoint, tmp_path / "run", "--steps", "1"))
    assert result.exit_code == 2, result.output
    assert f"node 0 cannot listen at {endpoint} (Address already in use)" in _one_line(
        result.stderr)


@pytest.mark.slow
def test_two_nodes_train_what_one_process_trains(tmp_path):
    """Node 1 in a subprocess, started first; node 0 in this process."""
    out, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    node1 = _start(_node(1, endpoint, out, "--steps", "4"))
    try:
        node0 = CliRunner().invoke(app, _node(0, endpoint, out, "--steps", "4"))
    finally:
        [(code1, stdout1, stderr1)] = _finish([node1])
    assert node0.exit_code == 0, node0.output
    assert code1 == 0, stdout1 + stderr1
    result = RunResult.load(out / "result.json")
    assert (result.nnodes, result.nproc, result.global_batch) == (2, 2, 8)
    reference = reference_run(TrainSettings.load(out / "train.json"), steps=4)
    divergence = compare(result, torch.load(out / "model.pt", weights_only=True), reference,
                         exact=True)
    assert divergence.largest < FLOAT32_ROUNDING, divergence
    assert {path.name for path in out.iterdir()} >= {"torchrun.log", "torchrun.node1.log",
                                                     "run.lock", "run.node1.lock"}


@pytest.mark.slow
def test_a_node_that_dies_ends_the_other_naming_it(tmp_path):
    out, endpoint = tmp_path / "run", f"127.0.0.1:{free_port()}"
    # a collective timeout past WAIT_SECONDS: node 0 ends in time only on the lost connection
    long_run = ("--steps", "100000", "--checkpoint-every", "5", "--timeout", "600")
    nodes = [_start(_node(rank, endpoint, out, *long_run)) for rank in (0, 1)]
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not (out / "checkpoint.pt").exists():  # both nodes' workers are training
            assert all(node.poll() is None for node in nodes), _finish(nodes)
            assert time.monotonic() < deadline, "the nodes never started training"
            time.sleep(0.2)
        rendezvous = int(endpoint.rpartition(":")[2])
        listeners = {address for node in nodes
                     for address, port in listening_addresses(psutil.Process(node.pid))
                     if port == rendezvous}
        assert listeners == {"127.0.0.1"}, listeners  # where the user said, and only there
        torchrun_child(nodes[1]).send_signal(signal.SIGKILL)  # node 1's machine goes
        outcomes = _finish(nodes)
    finally:
        for node in nodes:
            kill_tree(node)
    (code0, _, stderr0), (code1, _, stderr1) = outcomes
    assert code1 == 1 and _one_line(stderr1).endswith(
        f"torchrun was killed (SIGKILL), and its workers with it (torchrun exit code -9; "
        f"log: {out / 'torchrun.node1.log'})"), stderr1
    assert code0 == 1 and "rank 1 (node 1) stopped without an error" in _one_line(stderr0)
    deadline = time.monotonic() + WAIT_SECONDS  # the workers exit as their pipes close
    while processes_mentioning(str(out)):
        assert time.monotonic() < deadline, processes_mentioning(str(out))
        time.sleep(0.2)


@pytest.mark.slow
def test_a_node_alone_says_whom_it_waits_for_and_stops_when_told(tmp_path):
    """Node 0 alone (its endpoint bound where the user said, and only there) and node 1 alone
    (nothing listens at its endpoint) each say what they wait for; Ctrl-C ends them."""
    alone = {rank: (tmp_path / f"run{rank}", f"127.0.0.1:{free_port()}") for rank in (0, 1)}
    nodes = {rank: subprocess.Popen([str(LAYERWISE), *_node(rank, endpoint, out, "--steps", "1")],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    preexec_fn=as_from_a_terminal)
             for rank, (out, endpoint) in alone.items()}
    try:
        lines = {rank: node.stdout.readline() for rank, node in nodes.items() if node.stdout}
        port = int(alone[0][1].rpartition(":")[2])
        listeners = {address for address, bound in listening_addresses(psutil.Process(nodes[0].pid))
                     if bound == port}
        for node in nodes.values():
            node.send_signal(signal.SIGINT)
            node.wait(timeout=WAIT_SECONDS)
    finally:
        for node in nodes.values():
            kill_tree(node)
    # node 0's own agent has joined by then, or is still starting on a busy machine
    assert re.match(rf"waiting for the nodes at {re.escape(alone[0][1])}: [01] of 2 joined \(",
                    lines[0]), lines
    assert lines[1].startswith(f"waiting for node 0 at {alone[1][1]} ("), lines
    assert listeners == {"127.0.0.1"}, listeners
    assert all(node.returncode != 0 for node in nodes.values())
    assert not any(processes_mentioning(str(out)) for out, _ in alone.values())


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]

