"""How a timing rotates a kernel's data (`profiler.rotation`): weights come from DRAM in a model, so
their copies must exceed L2 whatever the kernel's size; small activations stay as they were."""
import pytest

from tessera.cost.profiler import L2_BYTES, LAUNCHES, MAX_LAUNCHES, rotation


@pytest.mark.parametrize("io_bytes,weight_bytes", [
    (2 * 128 * 768 * 2, 768 * 768 * 2),     # gpt2's attention output projection, 128 tokens, fp16
    (2 * 128 * 768 * 2, 768 * 3072 * 2),    # its MLP projection
    (4 << 20, 300 << 10),                   # a small weight beside a large activation
    (1 << 10, 256 << 10),                   # the smallest weight timed as a copy (COLD_CONSTANT_BYTES)
])
def test_weight_copies_exceed_l2_and_each_launch_reads_its_own(io_bytes: int, weight_bytes: int) -> None:
    copies, weight_copies, launches = rotation(io_bytes, weight_bytes)
    assert copies * io_bytes + weight_copies * weight_bytes >= L2_BYTES
    assert launches >= weight_copies  # a copy that no launch reads would not evict anything
    assert LAUNCHES <= launches <= MAX_LAUNCHES
    assert 1 <= copies <= LAUNCHES


def test_without_weights_the_rotation_is_unchanged() -> None:
    # Inputs alone (the MCFuser cases' a, b and d): at most LAUNCHES copies, LAUNCHES launches.
    assert rotation(1 << 20, 0) == (LAUNCHES, 1, LAUNCHES)
    assert rotation(16 << 20, 0) == (4, 1, LAUNCHES)
    assert rotation(200 << 20, 0) == (1, 1, LAUNCHES)


def test_large_weights_need_no_extra_launches() -> None:
    copies, weight_copies, launches = rotation(1 << 20, 40 << 20)
    assert launches == LAUNCHES and weight_copies * (40 << 20) >= L2_BYTES


def test_a_kernel_whose_copies_exceed_l2_already_launches_as_before():
    # a convolution's 300 KB weight beside 20 MB of activations: four copies of both exceed L2, so no
    # further weight copies (and no 200 launches of a 10 us kernel per replay)
    assert rotation(20 << 20, 300 << 10) == (4, 4, LAUNCHES)
