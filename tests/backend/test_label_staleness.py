"""Labels on a shared volume: a change is seen within the bound even when stat() hides it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from backend.versions import LabelTable, label_staleness_bound_s

CONFIG = """model_config_list {
  config {
    name: "m"
    base_path: "/models/m"
    model_platform: "tensorflow"
    version_labels { key: "stable" value: %d }
  }
}
"""


def test_a_label_change_with_the_same_stat_is_seen_within_the_staleness_bound(
    tmp_path: Path,
) -> None:
    # What an NFS/EFS attribute cache shows a gateway: the file was rewritten, but inode, size
    # and mtime look as before. Only the content tells.
    config = tmp_path / "models.config"
    config.write_text(CONFIG % 1)
    table = LabelTable(str(config), recheck_s=0.2)
    assert table.version_for("m", "stable") == 1
    before = os.stat(config)

    config.write_text(CONFIG % 2)  # in place: same inode, same size
    os.utime(config, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(config)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino, before.st_size, before.st_mtime_ns,
    )  # fmt: skip
    changed_at = time.monotonic()
    bound_s = label_staleness_bound_s(table.recheck_s)

    seen = table.version_for("m", "stable")
    while seen != 2 and time.monotonic() - changed_at < bound_s + 1:
        time.sleep(0.05)
        seen = table.version_for("m", "stable")

    assert seen == 2
    assert time.monotonic() - changed_at <= bound_s


def test_an_unchanged_config_is_not_parsed_again(tmp_path: Path) -> None:
    config = tmp_path / "models.config"
    config.write_text(CONFIG % 1)
    table = LabelTable(str(config), recheck_s=0)
    first = table.labels("m")
    assert table._file is not None
    table._file.value["m"]["stable"] = 7  # a marker a re-parse would overwrite

    assert table.labels("m") == {"stable": 7} and first == {"stable": 1}
