"""The fp32 accuracy check: a binomial bound in whole images, or a share the user sets."""

from __future__ import annotations

import math

import pytest

from layerwise.strategies.exactness.accuracy import (
    Z_SCORE,
    binomial_tolerance_images,
    check_accuracy,
)

DIGITS_VAL = 359  # images in the digits validation split


def test_the_default_bound_is_three_sigma_of_two_binomial_draws() -> None:
    # p = 350/359: sd of the difference sqrt(2 * 359 * p * (1 - p)) = 4.18 images
    sd = math.sqrt(2 * DIGITS_VAL * (350 / DIGITS_VAL) * (9 / DIGITS_VAL))
    assert binomial_tolerance_images(DIGITS_VAL, 350) == math.ceil(Z_SCORE * sd) == 13


def test_a_perfect_or_hopeless_reference_still_allows_one_image() -> None:
    assert binomial_tolerance_images(DIGITS_VAL, DIGITS_VAL) == 1
    assert binomial_tolerance_images(DIGITS_VAL, 0) == 1


def test_one_flipped_image_passes_and_a_worse_model_fails() -> None:
    assert check_accuracy(349, 350, DIGITS_VAL, None).passed
    worse = check_accuracy(330, 350, DIGITS_VAL, None)
    assert not worse.passed and worse.difference_images == 20
    assert "20 image(s) apart, tolerance 13" in worse.describe()


@pytest.mark.parametrize(("tolerance", "allowed"), [(0.0, 0), (0.01, 3), (0.0028, 1)])
def test_a_configured_share_is_whole_images(tolerance: float, allowed: int) -> None:
    check = check_accuracy(350, 350, DIGITS_VAL, tolerance)
    assert check.tolerance_images == allowed and check.passed
    assert not check_accuracy(350 - allowed - 1, 350, DIGITS_VAL, tolerance).passed
