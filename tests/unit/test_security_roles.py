"""Roles in ZooKeeper (runtime/control/roles.py): credentials and the permission policy."""
import os

import pytest
from kazoo.security import Permissions as P

from streamnet.cli.common import read_secret
from streamnet.cli.submit import main
from streamnet.runtime.control import roles

SECRET = b"c" * 40


def test_credentials_are_derived_one_way_and_parsed_by_their_prefix():
    worker, secret = roles.parse(SECRET + b"\n")
    assert worker.role == roles.WORKER and secret == SECRET
    for role in (roles.SUBMIT, roles.OBSERVER):
        text = roles.credential_text(SECRET, role)
        cred, none = roles.parse(text)
        assert cred.role == role and none is None and SECRET not in text
        assert cred.id == roles.role_ids(SECRET)[role]       # the workers know it from the secret alone
    assert roles.credential_text(b"d" * 40, "submit") != roles.credential_text(SECRET, "submit")
    with pytest.raises(roles.CredentialError, match="64 hex digits"):
        roles.parse(b"streamnet-submit:not-hex")
    with pytest.raises(roles.CredentialError, match="workers use the cluster secret"):
        roles.credential_text(SECRET, "worker")
    ids = roles.role_ids(SECRET)
    assert roles.parse_ids_record(roles.ids_record(ids)) == ids and roles.parse_ids_record(b"junk") is None


def test_submitters_may_change_topologies_and_remove_assignments_only():
    for node in ("", "workers", "leader", "checkpoints", "unreachable"):
        assert roles.permissions(node) == {"worker": P.ALL, "submit": P.READ, "observer": P.READ}, node
    assert roles.permissions("topologies")["submit"] == P.READ | P.WRITE | P.CREATE | P.DELETE
    assert roles.permissions("assignments")["submit"] == P.READ | P.DELETE
    assert not any(perms & P.ADMIN for node in ("", "topologies", "assignments")
                   for role, perms in roles.permissions(node).items() if role != "worker")


def test_new_credential_writes_a_0600_file_from_the_cluster_secret_only(tmp_path, capsys):
    secret = tmp_path / "secret"
    assert main(["new-secret", str(secret)]) == 0
    out = str(tmp_path / "submit")
    assert main(["new-credential", "submit", out, "--secret-file", str(secret)]) == 0
    assert os.stat(out).st_mode & 0o777 == 0o600
    cred, _ = roles.parse(read_secret(out))
    assert cred.role == "submit" and cred.id == roles.role_ids(read_secret(str(secret)))["submit"]
    capsys.readouterr()
    assert main(["new-credential", "observer", str(tmp_path / "o"), "--secret-file", out]) == 2
    assert "new-credential needs the cluster secret" in capsys.readouterr().err
    assert main(["new-credential", "submit", out, "--secret-file", str(secret)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["new-credential", "observer", str(tmp_path / "o"), "--secret-file", str(secret)]) == 0
    assert "wrote an observer credential" in capsys.readouterr().err
