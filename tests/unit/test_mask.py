"""The mask for a run's secrets, on the nodes (a filter between a node script and its log) and here."""

from __future__ import annotations

import os
import subprocess
import sys

from fsdpctl.node.mask import Masker, from_environment
from tests.conftest import REPO

SECRET = "hf_Zq8 'x' \"y\" $(id)\nsecond-line-part"


def test_whole_values_and_their_lines_are_masked_and_nothing_else():
    masker = Masker([SECRET, "", "abc"])
    assert masker.text(f"token={SECRET}!") == "token=***!"
    assert masker.text("a line with hf_Zq8 'x' \"y\" $(id) in it") == "a line with *** in it"
    assert masker.text("second-line-part\n") == "***\n"
    assert masker.text("abcdef") == "***def"  # a whole value is masked however short
    assert masker.text("nothing secret here, seconds") == "nothing secret here, seconds"
    assert not Masker([]) and masker


def test_the_node_filter_masks_what_it_is_given_from_its_own_environment():
    env = {**os.environ, "PYTHONPATH": str(REPO), "FSDPCTL_SECRET_NAMES": "A_TOKEN,OTHER", "A_TOKEN": SECRET,
           "OTHER": "v4lue"}
    lines = f"start\nthe token is {SECRET} ok\nv4lue and v4lue\nend é✓\n".encode()
    done = subprocess.run([sys.executable, "-m", "fsdpctl.node.mask"], input=lines, env=env, capture_output=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    # the value spans two lines: each of its lines is masked where it is printed
    assert done.stdout.decode() == "start\nthe token is ***\n*** ok\n*** and ***\nend é✓\n"
    assert from_environment({"FSDPCTL_SECRET_NAMES": "X", "X": "secret-x"}).text("secret-x") == "***"
