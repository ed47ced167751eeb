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
