"""The run's environment names memlab's commit, and says so when the code that ran is not that commit's."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from memlab.core import environment as env


def _answers(sha, status):
    return lambda cwd, *args: {"rev-parse": sha, "status": status}[args[0]]


@pytest.mark.parametrize("sha, status, expect", [
    ("abc123", "", "abc123"),
    ("abc123", " M core/estimate.py", "abc123+dirty"),
    ("abc123", None, "abc123"),  # status failed: the commit alone, not a guess
    (None, "", None),  # not a git checkout
])
def test_the_commit_and_whether_the_tree_differs_from_it(monkeypatch, sha, status, expect):
    monkeypatch.setattr(env, "_git", _answers(sha, status))
    assert env.git_sha() == expect


@pytest.mark.skipif(shutil.which("git") is None, reason="no git here")
def test_git_status_sees_a_changed_tracked_file_and_not_an_untracked_one(tmp_path):
    run = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q")
    (tmp_path / "f.py").write_text("a = 1\n")
    run("add", "f.py")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    (tmp_path / "new.py").write_text("untracked\n")
    assert env._git(tmp_path, "status", "--porcelain", "--untracked-files=no") == ""
    (tmp_path / "f.py").write_text("a = 2\n")
    assert env._git(tmp_path, "status", "--porcelain", "--untracked-files=no") == "M f.py"
