"""Transparent huge pages for torch's large CPU tensors, in every process layerwise starts.

A CPU training step allocates its large tensors afresh (weight gradients, SGD's weight-decay
sum, activations) and glibc hands each one above its mmap threshold (at most 32 MB) back to
the kernel when it is freed, so the next step faults every 4 KB page in again, zeroed. On
AlexNet (58M weights) that is most of a step's system time: a 15-strategy float64 `layerwise
verify` took 30M page faults. torch maps tensors of 2 MB and more on 2 MB pages when the variable
below is set (torch 2.2's CPU allocator, opt-in), 512 times fewer faults;
benchmarks/bench_huge_pages.py measures what that does to step times, side by side.

torch reads the variable once, at its first allocation, so it is set before torch is imported:
the CLI's `main` sets it for its own process and the processes it starts, and the launcher
passes it to the torchrun workers whoever calls it. A value the user set wins
(`THP_MEM_ALLOC_ENABLE=0` turns it off), and it is left unset where the kernel offers no
transparent huge pages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

HUGE_PAGES_VARIABLE = "THP_MEM_ALLOC_ENABLE"
# The kernel's switch: "always", "madvise" (what torch's madvise asks for) or "never"
# (docs.kernel.org, admin-guide/mm/transhuge); the selected mode is in brackets.
_KERNEL_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def kernel_offers_huge_pages(setting: Path = _KERNEL_SETTING) -> bool:
    """Whether a madvise for huge pages takes effect here (mode always or madvise)."""
    try:
        text = setting.read_text()
    except OSError:
        return False
    return "[always]" in text or "[madvise]" in text


def with_huge_pages(environment: Mapping[str, str]) -> dict[str, str]:
    """`environment` with torch's huge pages on, unless it says otherwise or the kernel has
    none to give."""
    if HUGE_PAGES_VARIABLE in environment or not kernel_offers_huge_pages():
        return dict(environment)
    return {**environment, HUGE_PAGES_VARIABLE: "1"}


def huge_pages_in_use(environment: Mapping[str, str] = os.environ) -> bool:
    """Whether torch in a process with `environment` puts its large tensors on huge pages
    (torch 2.13 takes the value 1 only)."""
    return environment.get(HUGE_PAGES_VARIABLE) == "1" and kernel_offers_huge_pages()


def use_huge_pages() -> None:
    """Turn huge pages on for this process (before it imports torch) and its children."""
    os.environ.update(with_huge_pages(os.environ))
