import pytest

from memlab.errors import MemlabError, check_choice, check_positive_int, require


def test_check_choice_names_value_and_accepted():
    assert check_choice("scale", "ci", ("ci", "full")) == "ci"
    with pytest.raises(MemlabError, match="unknown scale 'x'; accepted: ci, full"):
        check_choice("scale", "x", ("ci", "full"))


@pytest.mark.parametrize("bad", [0, -3, 2.5, "4", True, None])
def test_check_positive_int(bad):
    with pytest.raises(MemlabError, match="batch_size must be a positive integer"):
        check_positive_int("batch_size", bad)
    assert check_positive_int("batch_size", 8) == 8


def test_require_names_the_install_command():
    assert require("json", "reading records").dumps([]) == "[]"
    with pytest.raises(MemlabError, match=r"needs the optional package 'no_such_pkg_x'.*memlab\[quant\]"):
        require("no_such_pkg_x", "4-bit weights", extra="quant")


def test_optional_package_notices_are_dropped_and_others_kept():
    """memlab drops the listed notices of optional packages, and only those."""
    import logging

    from memlab.errors import QUIET_NOTICES

    for name, fragments in QUIET_NOTICES.items():
        logger = logging.getLogger(name)
        dropped = logging.LogRecord(name, logging.WARNING, __file__, 1, f"x {fragments[0]} y", None, None)
        kept = logging.LogRecord(name, logging.WARNING, __file__, 1, "something else", None, None)
        assert not logger.filter(dropped)
        assert logger.filter(kept)


def test_importing_bitsandbytes_after_memlab_prints_nothing():
    """A notebook cell that imports bitsandbytes after memlab writes no stderr (the book treats stderr as a warning)."""
    import subprocess
    import sys

    pytest.importorskip("bitsandbytes")
    out = subprocess.run([sys.executable, "-c", "import memlab, bitsandbytes.functional"],
                         capture_output=True, text=True, check=True)
    assert out.stderr == ""
