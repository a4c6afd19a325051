"""`python -m benchmarks.hot_key` runs each index of the key with a shared key and with keys of their own, and
writes what each batch cost."""

import json

from benchmarks import hot_key


def test_each_index_and_kind_of_key_is_run_and_reported(tmp_path):
    out = tmp_path / "hot-key.json"
    assert hot_key.main(["--rows", "400", "--batch", "100", "--rounds", "2", "--data-dir", str(tmp_path / "pg"),
                         "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["arms"]) == {"btree-hot", "btree-unique", "hash-hot", "hash-unique"}
    for arm in result["arms"].values():
        assert arm["rounds"] == 2 and arm["total_s"] > 0 and arm["first_tenth_batch_ms"] > 0
    assert result["command"].startswith("python -m benchmarks.hot_key --rows 400")
    assert result["code"]["git_commit"] and result["machine"]
