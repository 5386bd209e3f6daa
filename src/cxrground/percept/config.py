"""Constants of CheXpercept mask refinement, deformation and distractors (CHEXPERCEPT.md §6-§9).

Every pixel constant is given at the reference scale (``@1024``, longest image side 1024 px) and applied
through the §0 scale rule (:mod:`cxrground.anatomy.scale`): lengths × ``s``, areas × ``s²``, kernel sizes
rounded to the nearest integer ≥ 1, ``s = L / 1024`` with ``L`` the longest side of the image.
:meth:`DeformConfig.scaled` returns the pixel values for one image shape as a :class:`ScaledDeform`.

Choices where the spec is silent are documented on the fields (``choice:``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from cxrground.anatomy.scale import scale_area, scale_kernel, scale_length
from cxrground.vocab.percept_templates import POINT_RADIUS_AT_1024, POINT_RING_WIDTH
from cxrground.vocab.traits import traits

__all__ = ["DeformConfig", "ScaledDeform", "point_margin"]


@dataclass(frozen=True)
class ScaledDeform:
    """The pixel constants of :class:`DeformConfig` for one image (lengths in px, areas in px²)."""

    longest_side: int
    min_area: float
    refine_kernel: int
    grid_step: float
    kernel: int
    opposite_min_dist: float
    point_spacing: float
    builtin_disc: float
    builtin_contraction_margin: float
    fake_min_dist: float
    fake_fallback_max: float
    gt_point_min_dist: float
    default_kernel: int
    point_margin: int = 0
    """Distance in px every drawn point (GT and distractor) keeps from the film's border: the §10.1 disc radius plus
    half its white ring, rounded up, so that its whole disc is drawn on the film."""

    @property
    def kernel_radius(self) -> float:
        """Radius of one dilation/erosion iteration with the ``kernel × kernel`` ellipse (``kernel / 2``)."""
        return self.kernel / 2.0


@dataclass(frozen=True)
class DeformConfig:
    """Every constant of §6-§9 at ``@1024`` (section in the comment); use :meth:`scaled` for pixels."""

    # §6 refinement
    min_component_area: float = 1000.0  # §6: components / pieces below this many px (@1024) are dropped
    refine_kernel: int = 15  # §6: closing then opening with a disc of this diameter (@1024)
    grid_step: float = 64.0  # §6: refinement points on a 64 px lattice (@1024)
    # §7 deformation point sampling
    component_attempts: int = 10  # §7: attempts per optimal component
    point_tries: int = 3  # §7.2: tries per anatomy
    kernel: int = 32  # §7.2: 32×32 ellipse kernel (one iteration ≈ 16 px)
    lung_depth: int = 2  # §7.1: depth for lung lesions
    cardiomegaly_depth: int = 1  # §7.1: depth for cardiomegaly
    expansion_iterations_per_depth: int = 2  # §7.2: dilate 2·d iterations at depth d
    contraction_iterations_per_depth: int = 1  # §7.2: erode 1 iteration per depth
    opposite_min_dist: float = 50.0  # §7.2: candidates ≥ 50 px from chosen points of the opposite operation
    width_choices: tuple[int, ...] = (2, 3, 4)  # §7.2: depth-1 width w1
    deep_width_choices: tuple[int, ...] = (3, 4, 5)  # §9.2: w1 when depth > 2
    point_spacing: float = 30.0  # §7.2: depth-1 points ≥ 30 px apart
    region_contract_min: float = 0.75  # §7.1: region ratio ≥ 0.75 → contraction
    region_expand_max: float = 0.5  # §7.1: region ratio ≤ 0.5 → expansion
    lung_contract_min: float = 0.7  # §7.1: same-side lung ratio ≥ 0.7 → contraction
    cardiomegaly_max_zones: int = 3  # §7.1: n ~ U{1,2,3} zones for cardiomegaly
    cpa_same_side: bool = True  # §7.1/§19.8: a lung-base zone accepts only its own side's CPA (False = reference)
    # §7.3 applying points
    logit_fill: float = 18.420680743952367  # §7.3: ln(1/1e-8), value inside the current mask
    logit_outside: float = -18.420680743952367  # choice: value outside the mask when no previous logits exist
    organic_radius: float = 15.0  # §7.3: organic kernel radius, in pixels of a 288-px low-res grid
    organic_reference_grid: int = 288  # §7.3: the reference low-res grid N; choice: radius scales by N/288
    organic_frequencies: tuple[int, ...] = (1, 2, 4)  # §7.3: noise octaves, each divided by its frequency
    organic_axis_range: tuple[float, float] = (0.5, 1.5)  # §7.3: ellipse axis scales U(0.5, 1.5)
    organic_threshold: float = 0.1  # §7.3: stamp where kernel > 0.1
    builtin_disc: float = 16.0  # §7.3 non-SAM: expansion disc radius (spec: ≥ 8 px @1024); choice: 16
    builtin_contraction_margin: float = 8.0  # choice: contraction disc radius = depth below contour + 8 px
    # §8 sequential steps
    repeats: int = 10  # §8: repeats of the step sampling
    max_step_anatomies: int = 3  # §8: |S| = min(U{1,2,3}, |possible anatomies|)
    gt_point_min_dist: float = 30.0  # choice (§19.14): GT centre points ≥ 2 × 15 px disc radius apart
    # §9.1 distractor points
    fake_points_per_pass: int = 5  # §9.1: up to 5 points per pass
    fake_min_dist: float = 100.0  # §9.1: ≥ 100 px from centre, fakes, opposite points, GT points
    fake_point_retries: int = 3  # §9.1: retries until ≥ 2 points
    fake_points_min: int = 2  # §9.1: a pass wants at least 2 points
    fake_fallback_max: float = 300.0  # §9.1: fallback lung pixels 100-300 px from the centre
    max_points: int = 8  # §9.1/§3.3: ≤ 8 point options (GT + fakes)
    # §9.2 distractor masks
    fake_masks_per_pass: int = 4  # §9.2: aim for 4 fakes per operation
    fake_mask_max_failures: int = 10  # §9.2: at most 10 consecutive failures per pass
    fake_mask_depth_retries: int = 3  # §9.2: depth + 1 on retries, up to 3 times
    # §9.3 revision-result options
    max_fake_options: int = 3  # §9.3: 3 fakes + the answer = 4 options
    min_fake_options: int = 2  # §3.4: 3 options when too few distractors exist; fewer fails the case
    default_kernel: int = 5  # §9.3: cardiomegaly default_dilated / default_eroded, 5×5 square (@1024) …
    default_iterations: int = 3  # §9.3: … 3 iterations
    option_redraws: int = field(default=1000)  # choice: candidate combinations tried before the case fails
    option_max_iou: float = 0.98  # choice (§9.3, §19.14): options, the shown mask included, differ visibly: IoU below

    def __post_init__(self) -> None:
        if self.min_component_area <= 0 or self.kernel < 1 or self.refine_kernel < 1:
            raise ValueError("DeformConfig: areas and kernels must be positive")
        if not self.width_choices or min(self.width_choices) < 2:
            raise ValueError("DeformConfig: widths must be ≥ 2")

    def depth(self, lesion: str) -> int:
        """Return the §7.1 deformation depth of ``lesion`` (organ scheme, i.e. cardiomegaly: 1; lung scheme: 2)."""
        return self.cardiomegaly_depth if traits(lesion).percept.deform == "organ" else self.lung_depth

    def scaled(self, shape: Sequence[int]) -> ScaledDeform:
        """Return the pixel constants for an image of ``shape`` ``(H, W)`` (§0 scale rule)."""
        side = int(max(int(shape[0]), int(shape[1])))
        return ScaledDeform(
            longest_side=side,
            min_area=scale_area(self.min_component_area, side),
            refine_kernel=scale_kernel(self.refine_kernel, side),
            grid_step=max(1.0, scale_length(self.grid_step, side)),
            kernel=scale_kernel(self.kernel, side),
            opposite_min_dist=scale_length(self.opposite_min_dist, side),
            point_spacing=scale_length(self.point_spacing, side),
            builtin_disc=max(1.0, scale_length(self.builtin_disc, side)),
            builtin_contraction_margin=max(1.0, scale_length(self.builtin_contraction_margin, side)),
            fake_min_dist=scale_length(self.fake_min_dist, side),
            fake_fallback_max=scale_length(self.fake_fallback_max, side),
            gt_point_min_dist=scale_length(self.gt_point_min_dist, side),
            default_kernel=scale_kernel(self.default_kernel, side),
            point_margin=point_margin(side),
        )


def point_margin(longest_side: int) -> int:
    """Pixels a point disc of §10.1 (radius ``15·s`` plus half of its ``2·s`` ring, ring ≥ 1 px) reaches from its
    centre on a film whose longest side is ``longest_side``, rounded up: a point centre at least this far inside
    the film is drawn whole."""
    radius = scale_length(POINT_RADIUS_AT_1024, longest_side)
    ring = max(1.0, scale_length(POINT_RING_WIDTH, longest_side))
    return math.ceil(radius + ring / 2)
