"""kazoo logs each request it sends at DEBUG, the digest credential of a connect included:
a worker run with --log-level DEBUG wrote its role's ZooKeeper password to its log."""
import logging

from kazoo.protocol.serialization import Auth

import streamnet.runtime.control.zk  # noqa: F401  (installs the filter)


def test_a_connects_credential_is_left_out_of_kazoos_debug_log(caplog):
    kazoo_log = logging.getLogger("kazoo.client")
    with caplog.at_level(logging.DEBUG, logger="kazoo.client"):
        # as kazoo's connection logs a request it sends (protocol/connection.py)
        kazoo_log.log(logging.DEBUG, "Sending request(xid=%s): %s", -4, Auth(0, "digest", "streamnet:0123abcd" * 4))
        kazoo_log.log(logging.DEBUG, "Sending request(xid=%s): %s", 7, "GetData(path='/streamnet')")
    assert "0123abcd" not in caplog.text
    assert "Sending request(xid=-4): Auth(<credential left out>)" in caplog.text
    assert "GetData(path='/streamnet')" in caplog.text          # the rest is logged as it was
