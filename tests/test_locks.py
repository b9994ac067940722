"""Locks where flock fails or does not exclude: one line naming the lock file, the file system
and the way out; a child process must fail to take a held lock; any lock file content is
described without crashing; the workdir lock's holder removes the temporaries of killed
writes."""

import errno
import fcntl
import os

import pytest

from t2t_jax.run import files, lock
from t2t_jax.run.workdir import Workdir


def _fake_mounts(tmp_path, monkeypatch, fstype, options="rw,relatime"):
  """A mount table with the real root and `tmp_path` mounted as `fstype`."""
  table = tmp_path / "mounts"
  table.write_text(
    f"/dev/root / ext4 rw 0 0\nserver:/export {os.path.realpath(tmp_path)} {fstype} {options} 0 0\n"
  )
  monkeypatch.setattr(lock, "MOUNTS", str(table))


def _one_line(error: BaseException) -> str:
  text = str(error)
  assert "\n" not in text and "Traceback" not in text
  return text


def test_a_file_system_without_flock_is_refused_in_one_line_naming_it(tmp_path, monkeypatch):
  _fake_mounts(tmp_path, monkeypatch, "fuse.sshfs")
  workdir = tmp_path / "w"
  workdir.mkdir()

  def no_locks(fd, operation):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

  monkeypatch.setattr(fcntl, "flock", no_locks)
  with pytest.raises(lock.WorkdirLockedError) as e:
    lock.WorkdirLock(str(workdir)).acquire()
  text = _one_line(e.value)
  assert f"lock file {workdir}/lock" in text
  assert f"the fuse.sshfs file system at {os.path.realpath(tmp_path)} cannot flock" in text
  assert os.strerror(errno.ENOLCK) in text and "put --workdir on a local file system" in text


@pytest.mark.parametrize("option", ["local_lock=all", "local_lock=flock", "nolock"])
def test_nfs_with_host_local_locks_is_refused_naming_the_option(tmp_path, monkeypatch, option):
  _fake_mounts(tmp_path, monkeypatch, "nfs4", f"rw,vers=4.2,{option},addr=10.0.0.1")
  with pytest.raises(lock.WorkdirLockedError) as e:
    lock.WorkdirLock(str(tmp_path)).acquire()
  text = _one_line(e.value)
  assert f"the nfs4 file system at {os.path.realpath(tmp_path)} is mounted with {option}" in text
  assert "other hosts" in text and "put --workdir on a local file system" in text


def test_nfs_with_shared_locks_and_an_unreadable_mount_table_are_accepted(tmp_path, monkeypatch):
  _fake_mounts(tmp_path, monkeypatch, "nfs4", "rw,vers=4.2,local_lock=none")
  with lock.WorkdirLock(str(tmp_path)):
    pass
  monkeypatch.setattr(lock, "MOUNTS", str(tmp_path / "no_such_table"))
  assert lock.file_system(str(tmp_path)) == ("?", "unknown", [])
  with lock.WorkdirLock(str(tmp_path)):
    pass


def test_the_probe_child_fails_on_a_held_lock_and_succeeds_on_a_free_one(tmp_path):
  path = str(tmp_path / "lock")
  with lock.FileLock(path, "way out"):
    assert not lock.another_process_can_take(path)
  assert lock.another_process_can_take(path)  # released: the probe can tell the difference


def test_a_lock_another_process_can_also_take_is_refused_and_released(tmp_path, monkeypatch):
  monkeypatch.setattr(lock, "another_process_can_take", lambda path: True)
  with pytest.raises(lock.WorkdirLockedError) as e:
    lock.WorkdirLock(str(tmp_path)).acquire()
  text = _one_line(e.value)
  assert f"lock file {tmp_path}/lock:" in text and "does not exclude" in text
  assert "put --workdir on a local file system" in text
  monkeypatch.undo()
  with lock.WorkdirLock(str(tmp_path)):  # the refused attempt kept no flock
    pass


@pytest.mark.parametrize(
  "content", ["42", "[1, 2]", '"me"', "null", "true", "{not json", '{"other": 1}']
)
def test_a_lock_file_holding_any_json_names_an_unknown_holder(tmp_path, content):
  workdir = str(tmp_path)
  path = Workdir(workdir).lock_file
  with open(path, "w") as f:
    f.write(content)
  held = os.open(path, os.O_RDWR)  # a live holder that wrote something else
  fcntl.flock(held, fcntl.LOCK_EX)
  try:
    with pytest.raises(lock.WorkdirLockedError) as e:
      lock.WorkdirLock(workdir).acquire()
  finally:
    os.close(held)
  assert f"an unknown holder (the lock file holds {content!r})" in _one_line(e.value)
  with lock.WorkdirLock(workdir):  # taken over from a dead holder of that content
    pass


def test_a_holder_with_a_senseless_start_time_is_still_named():
  text = lock.describe_holder('{"pid": 7, "host": "h", "start_time": "yesterday"}')
  assert text == "pid 7 on host h (started at an unknown time)"


def test_temporary_names_hold_the_host_and_differ_per_write():
  host = os.uname().nodename
  a, b = files.temporary_name("config.json"), files.temporary_name("config.json")
  assert a.startswith(f"config.json.tmp-{host}-{os.getpid()}-") and a != b


def test_the_workdir_lock_holder_removes_only_its_files_temporaries(tmp_path):
  workdir = Workdir(str(tmp_path))
  stale = [".config.json.tmp-otherhost-12-ab", ".best.json.tmp-h-3-cd", ".test.de.tmp-h-4-ef"]
  kept = [".out.txt.tmp-h-5-aa", "config.json", "notes.tmp-h-1-bb"]
  for name in stale + kept:
    (tmp_path / name).write_text("x")
  assert sorted(workdir.remove_stale_temporaries()) == sorted(stale)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_an_atomic_write_fsyncs_the_file_and_then_its_directory(tmp_path, monkeypatch):
  synced = []
  real = os.fsync

  def fsync(fd):
    synced.append(os.readlink(f"/proc/self/fd/{fd}"))
    real(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  files.atomic_write_text(tmp_path / "selected.json", "{}")
  assert len(synced) == 2 and f".selected.json.tmp-{os.uname().nodename}-" in synced[0]
  assert synced[1] == str(tmp_path)
  assert (tmp_path / "selected.json").read_text() == "{}"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["selected.json"]
