"""Who may do what in a cluster's ZooKeeper nodes: three roles, one credential each.

    worker    the cluster secret itself: everything (workers register, elect a leader,
              write assignments, task state, results, checkpoint pointers)
    submit    submit, kill, stop and rebalance topologies (everything under
              topologies/, and removing a killed topology's assignment); read the rest.
              Cannot write an assignment, a worker record or the election.
    observer  read only (streamnet-ui, monitoring scripts)

The submit and observer credentials are derived from the cluster secret with a
one-way function (`credential_text`, written by `streamnet-submit new-credential`):
whoever holds one cannot recover the secret, and workers, which hold the secret,
know every role's ZooKeeper identity without further configuration. A credential
file reads `streamnet-submit:<password>` (or `streamnet-observer:...`); any other
content of a --secret-file is the cluster secret.

ZooKeeper's digest scheme (no server configuration needed) checks these: each node
carries an ACL of digest ids. Workers create the cluster's top nodes with the ACLs
of `permissions` and record every role's id in the cluster node (`ids_record`);
every node below a top node gets that top node's ACL, so a submitter's topology
node grants the workers what they need (the submitter reads their id from the
record, and checks its own there: a credential of another cluster is refused), except
what workers write under a topology (WORKER_WRITTEN). The digest password crosses the network in clear
on every connect: it is derived per role, so a sniffed one is that role's
credential, never the cluster secret.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

from ...errors import StreamnetError

WORKER, SUBMIT, OBSERVER = "worker", "submit", "observer"
ROLES = (WORKER, SUBMIT, OBSERVER)
USERS = {WORKER: "streamnet", SUBMIT: "streamnet-submit", OBSERVER: "streamnet-observer"}

R, W, C, D, A = Permissions.READ, Permissions.WRITE, Permissions.CREATE, Permissions.DELETE, Permissions.ADMIN
ALL = Permissions.ALL

#: what each role may do on the cluster's top nodes (cluster_state.TOP_NODES; the rest
#: of the tree inherits): submitters get no ADMIN anywhere, so they cannot change an
#: ACL to lock the workers out
_SUBMIT = {"topologies": R | W | C | D, "assignments": R | D}    # kill removes the assignment


#: what workers write under a topology's node - task state (the fencing tokens of task
#: instances), done and stopped marks, the assignment versions they applied, results,
#: the leader's balance log: submitters read it and delete it with the topology (DELETE
#: on these nodes lets them remove their children), but cannot write it (a submitter
#: forged another topology's state, or that workers had applied an assignment)
WORKER_WRITTEN = frozenset({"state", "done", "applied", "stopped", "results", "balance"})


def permissions(node: str, below: tuple[str, ...] | list[str] = ()) -> dict[str, int]:
    """{role: permissions} on top node `node` ("" is the cluster node itself), or on the
    node at path `below` under it (the parts after the top node's name)."""
    if node == "topologies" and len(below) >= 2 and below[1] in WORKER_WRITTEN:
        return {WORKER: ALL, SUBMIT: R | D, OBSERVER: R}
    return {WORKER: ALL, SUBMIT: _SUBMIT.get(node, R), OBSERVER: R}


class CredentialError(StreamnetError):
    pass


def _password(secret: bytes, role: str) -> str:
    if role == WORKER:      # as before roles existed: clusters made then keep working
        return hmac.new(secret, b"streamnet zookeeper digest", hashlib.sha256).hexdigest()
    return hmac.new(secret, f"streamnet zookeeper {role}".encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Credential:
    role: str
    password: str

    @property
    def user(self) -> str:
        return USERS[self.role]

    @property
    def auth(self) -> tuple[str, str]:
        """kazoo's auth_data entry."""
        return "digest", f"{self.user}:{self.password}"

    @property
    def id(self) -> Id:
        return Id("digest", make_digest_acl_credential(self.user, self.password))


def parse(content: bytes) -> tuple[Credential, bytes | None]:
    """(credential, the cluster secret or None) from a --secret-file's content."""
    text = content.strip()
    for role in (SUBMIT, OBSERVER):
        prefix = USERS[role].encode() + b":"
        if text.startswith(prefix):
            password = text[len(prefix):].decode("ascii", errors="replace")
            if len(password) != 64 or any(c not in "0123456789abcdef" for c in password):
                raise CredentialError(f"a {role} credential holds 64 hex digits after '{USERS[role]}:'; "
                                      "write a new one with `streamnet-submit new-credential`")
            return Credential(role, password), None
    return Credential(WORKER, _password(text, WORKER)), text


def credential_text(secret: bytes, role: str) -> bytes:
    """The content of a `role` credential file for the cluster of `secret`."""
    if role not in (SUBMIT, OBSERVER):
        raise CredentialError(f"credentials are written for the submit and observer roles; got {role!r} "
                              "(workers use the cluster secret itself)")
    return f"{USERS[role]}:{_password(secret, role)}\n".encode()


def role_ids(secret: bytes) -> dict[str, Id]:
    """Every role's ZooKeeper identity, as the workers (who hold the secret) know them."""
    return {role: Credential(role, _password(secret, role)).id for role in ROLES}


def ids_record(ids: dict[str, Id]) -> bytes:
    """The cluster node's data: every role's ZooKeeper id (a SHA-1 of a 256-bit derived
    password: safe to show to every role), so that clients can make nodes whose ACL
    grants the workers what they need."""
    return json.dumps({"roles": {role: ids[role].id for role in ROLES}}, sort_keys=True).encode()


def parse_ids_record(data: bytes | None) -> dict[str, Id] | None:
    try:
        found = json.loads(data)["roles"]
        return {role: Id("digest", str(found[role])) for role in ROLES}
    except (TypeError, ValueError, KeyError):
        return None


def top_acl(secret: bytes, node: str) -> list[ACL]:
    ids = role_ids(secret)
    return [ACL(perms, ids[role]) for role, perms in permissions(node).items()]


def describe(acl) -> str:
    """An ACL as one line: 'digest:streamnet:...=ALL, world:anyone=READ'."""
    names = {R: "READ", W: "WRITE", C: "CREATE", D: "DELETE", A: "ADMIN"}
    out = []
    for entry in acl:
        perms = "ALL" if entry.perms == ALL else "|".join(n for bit, n in names.items() if entry.perms & bit)
        out.append(f"{entry.id.scheme}:{entry.id.id.split(':')[0]}={perms or 'none'}")
    return ", ".join(out)
