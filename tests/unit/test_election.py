"""Leader election on the in-process coordinator: a candidate deposed while alive stands again."""
from streamnet.runtime import wait_for
from streamnet.runtime.control.cluster_state import ClusterState
from streamnet.runtime.control.election import Election
from streamnet.runtime.control.inprocess import InProcessServer


def test_a_leader_deposed_while_alive_stands_again_and_leads_once_the_other_dies():
    """The next in line deletes the leader's node when peers report it and its probe fails
    (a stalled loop, a split): the old leader's session lives on, so it never joined again -
    neither leader nor in line, for good - and once the new leader died no one led."""
    server = InProcessServer()
    try:
        s1, s2 = server.session(), server.session()
        e1 = Election(ClusterState(s1, "c"), "w1", lambda leading: None)
        e2 = Election(ClusterState(s2, "c"), "w2", lambda leading: None)
        e1.join()
        e2.join()
        wait_for(lambda: e1.is_leader and e2.next_in_line, 5, "w1 to lead, w2 next in line")
        deposed = e1.node
        s2.delete(deposed)                          # w2 takes over from a w1 it took for dead
        wait_for(lambda: e2.is_leader, 5, "w2 to lead")
        wait_for(lambda: e1.node != deposed and e1.next_in_line, 5, "w1 to stand again, next in line")
        s2.close()                                  # w2 dies
        wait_for(lambda: e1.is_leader, 5, "w1 to lead again")
        e1.leave()
        assert e1.node is None
    finally:
        server.shutdown()
