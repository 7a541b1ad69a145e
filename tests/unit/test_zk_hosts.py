"""The server list the ZooKeeper client is given (control/zk.py padded_hosts): kazoo
waits session_timeout / len(hosts) for an answer to each connect, so a short list is
repeated to give it several attempts within one session timeout."""
from kazoo.hosts import collect_hosts

from streamnet.runtime.control.zk import CONNECT_ATTEMPTS, padded_hosts


def test_one_server_is_listed_three_times():
    assert CONNECT_ATTEMPTS == 3
    assert padded_hosts("127.0.0.1:2181") == "127.0.0.1:2181,127.0.0.1:2181,127.0.0.1:2181"


def test_the_list_repeats_whole_and_keeps_its_chroot():
    assert padded_hosts("a:1,b:2") == "a:1,b:2,a:1,b:2"
    assert padded_hosts("a:1/streamnet/x") == "a:1,a:1,a:1/streamnet/x"
    hosts, chroot = collect_hosts(padded_hosts("a:1,b:2/root"))
    assert [h for h, _ in hosts] == ["a", "b", "a", "b"] and chroot == "/root"


def test_enough_servers_stay_as_they_are():
    assert padded_hosts("a:1,b:2,c:3") == "a:1,b:2,c:3"
    assert padded_hosts("a:1,b:2,c:3,d:4,e:5/r") == "a:1,b:2,c:3,d:4,e:5/r"
    assert padded_hosts("") == ""
