"""Whether an fp32 run's validation accuracy matches one-process training, judged statistically.

Exactness is proven in float64 (strategies/exactness/reference.py). In float32 a reduction in
another order changes the weights by 1e-4 within a few steps and training then follows its own path
(docs/research.md: measured behaviour), so two runs of one exact algorithm end as two models of the
same quality, not one model. Each classifies the n validation images right with the same probability
p: their correct counts are two binomial draws, whose difference has standard deviation sqrt(2 n p
(1 - p)). The default tolerance is Z_SCORE of those, in whole images: two equally good models land
outside it in 0.3% of pairs, on any CPU, while a strategy that trains a worse model lands outside
it.

A network that scores every position makes `per_sample` predictions per image, and they are not
independent draws (neighbouring positions are right or wrong together): the bound is then taken
over the images, as if each image's positions were all right or all wrong together (the widest
their correlation can make it), and scaled to positions.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

Z_SCORE = 3.0  # two-sided 99.7%: one false alarm in ~370 comparisons of equal models


class AccuracyCheck(BaseModel):
    """A run's correct validation images against the one-process run's, and the verdict."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    correct: int
    reference_correct: int
    images: int  # validation predictions: the split's size, times positions per sample
    tolerance_images: int
    rule: str  # how the tolerance was set, in words
    per_sample: int = 1  # predictions per sample: a dense output's positions

    @property
    def unit(self) -> str:
        return "image(s)" if self.per_sample == 1 else "position(s)"

    @property
    def accuracy(self) -> float:
        return self.correct / self.images

    @property
    def reference_accuracy(self) -> float:
        return self.reference_correct / self.images

    @property
    def difference_images(self) -> int:
        return abs(self.correct - self.reference_correct)

    @property
    def passed(self) -> bool:
        return self.difference_images <= self.tolerance_images

    def describe(self) -> str:
        return (f"{self.accuracy:.2%} ({self.correct}/{self.images}) against the one-process "
                f"run's {self.reference_accuracy:.2%} ({self.reference_correct}/{self.images}): "
                f"{self.difference_images} {self.unit} apart, tolerance {self.tolerance_images} "
                f"({self.rule})")


def binomial_tolerance_images(images: int, reference_correct: int, per_sample: int = 1) -> int:
    """Z_SCORE standard deviations of the difference of two Binomial(samples, p) counts, with
    p the one-process run's accuracy, in predictions (`per_sample` of them per sample), rounded
    up to whole predictions (at least one)."""
    p = reference_correct / images
    samples = images // per_sample
    return max(1, math.ceil(Z_SCORE * math.sqrt(2 * samples * p * (1 - p)) * per_sample))


def check_accuracy(correct: int, reference_correct: int, images: int,
                   tolerance: float | None, per_sample: int = 1) -> AccuracyCheck:
    """The check of one run: `tolerance` as a share of the split's predictions, or None for the
    binomial bound above."""
    samples = images // per_sample
    unit = "images" if per_sample == 1 else f"positions ({samples} images of {per_sample})"
    if tolerance is None:
        allowed = binomial_tolerance_images(images, reference_correct, per_sample)
        rule = (f"{Z_SCORE:g} sigma of two binomial draws of {images} images" if per_sample == 1
                else f"{Z_SCORE:g} sigma of two binomial draws of {samples} images, times "
                     f"{per_sample} positions each")
    else:
        allowed = math.floor(tolerance * images + 1e-9)
        rule = f"{tolerance:g} of {images} {unit}"
    return AccuracyCheck(correct=correct, reference_correct=reference_correct, images=images,
                         tolerance_images=allowed, rule=rule, per_sample=per_sample)
