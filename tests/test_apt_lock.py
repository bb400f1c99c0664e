"""scripts/apt.sh: apt-get waits for another apt/dpkg process's lock (a freshly booted
machine's unattended-upgrades) instead of failing at once with exit 100, for a bounded
time, with a message; scripts/setup.sh and scripts/install.sh call apt-get only
through it.

The real apt-get runs, pointed by APT_CONFIG at lists and cache directories of the
test's own with no sources (so ``apt-get update`` fetches nothing), while this process
holds the lists lock the way another apt-get would (an fcntl lock on ``lists/lock``).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
APT_SH = os.path.join(REPO, "scripts", "apt.sh")


@pytest.fixture
def apt_dirs(tmp_path):
    if not shutil.which("apt-get"):
        pytest.skip("no apt-get on this machine")
    for d in ("lists/partial", "cache/archives/partial", "parts", "prefs"):
        (tmp_path / d).mkdir(parents=True)
    conf = tmp_path / "apt.conf"
    conf.write_text(f'Dir::State::Lists "{tmp_path}/lists";\n'
                    f'Dir::Cache "{tmp_path}/cache";\n'
                    'Dir::Etc::SourceList "/dev/null";\n'
                    f'Dir::Etc::SourceParts "{tmp_path}/parts";\n'
                    f'Dir::Etc::PreferencesParts "{tmp_path}/prefs";\n')
    return tmp_path, str(conf)


def run_update(conf: str, wait: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "APT_CONFIG": conf, "CURVINE_APT_LOCK_WAIT": str(wait),
           "CURVINE_APT_RETRY_EVERY": "0.5"}
    return subprocess.run(["bash", "-c", f'. "{APT_SH}"; apt_get_waiting update -qq'],
                          env=env, capture_output=True, text=True, timeout=120)


def hold_lock(path: str):
    f = open(path, "a")
    fcntl.lockf(f, fcntl.LOCK_EX)
    return f


def test_apt_get_update_waits_for_a_held_lock_then_runs(apt_dirs):
    tmp, conf = apt_dirs
    held = hold_lock(str(tmp / "lists" / "lock"))
    releaser = threading.Timer(3.0, held.close)  # closing the file drops the lock
    releaser.start()
    start = time.monotonic()
    try:
        r = run_update(conf, wait=60)
    finally:
        releaser.cancel()
        held.close()
    took = time.monotonic() - start
    assert r.returncode == 0, r.stderr
    assert took >= 2.5, f"returned after {took:.1f}s, while the lock was held for 3s"
    assert re.search(r"holds its lock .*waiting up to 60s", r.stderr), r.stderr


def test_apt_get_gives_up_after_the_bound_and_says_why(apt_dirs):
    tmp, conf = apt_dirs
    held = hold_lock(str(tmp / "lists" / "lock"))
    start = time.monotonic()
    try:
        r = run_update(conf, wait=2)
    finally:
        held.close()
    took = time.monotonic() - start
    assert r.returncode != 0
    assert 1.0 <= took < 30, took  # bash's SECONDS counts whole seconds
    assert "Could not get lock" in r.stderr and "still holds its lock after 2s" in r.stderr


def test_another_error_is_not_waited_for(apt_dirs):
    tmp, conf = apt_dirs
    start = time.monotonic()
    env = {**os.environ, "APT_CONFIG": conf, "CURVINE_APT_LOCK_WAIT": "60"}
    r = subprocess.run(["bash", "-c", f'. "{APT_SH}"; apt_get_waiting no-such-command'],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and time.monotonic() - start < 20
    assert "waiting" not in r.stderr


@pytest.mark.parametrize("script", ["scripts/setup.sh", "scripts/install.sh"])
def test_the_install_scripts_call_apt_get_only_through_apt_sh(script):
    with open(os.path.join(REPO, script)) as f:
        text = f.read()
    assert re.search(r"^\. .*apt\.sh\"?$", text, re.M), f"{script} does not source scripts/apt.sh"
    # the commands of each line, without comments and quoted messages
    code = [re.sub(r'"[^"]*"', '""', ln) for ln in text.splitlines()
            if not ln.lstrip().startswith("#")]
    direct = [ln for ln in code if re.search(r"(^|[\s;&|(])apt-get\s", ln)
              and "command -v apt-get" not in ln]
    assert not direct, f"{script} runs apt-get itself: {direct}"
