#!/usr/bin/env bash
# Run ZooKeeper from Debian's `zookeeper` package, with its own data directory and ports.
#
#   deploy/zookeeper.sh start   [--port 2181] [--dir DIR] [--servers N] [--tick-ms 500] [--bind 127.0.0.1]
#                               [--client-ports P0,P1,..] [--peer-ports A0:B0,A1:B1,..] [--tls-dir DIR]
#   deploy/zookeeper.sh stop    [--dir DIR]
#   deploy/zookeeper.sh status  [--dir DIR]
#   deploy/zookeeper.sh kill    [--dir DIR] [--server I]    # SIGKILL one server (tests)
#   deploy/zookeeper.sh restart-server [--dir DIR] [--server I]
#
# --servers 1 (default) runs a standalone server (ZooKeeperServerMain); --servers 3 runs a
# 3-server ensemble on loopback (QuorumPeerMain), client ports PORT..PORT+2 and quorum/election
# ports from PORT+1000 up, unless --client-ports/--peer-ports name each one (the test harness
# does: it picks ports known to be free). `start` waits until every server serves (`srvr`
# reports its mode: standalone, leader or follower) and prints the connect string; a server
# whose process exits meanwhile is reported at once with the end of its log.
# The tick (--tick-ms) bounds session timeouts to [2, 20] ticks: 500 ms gives 1-10 s, which
# lets tests see failures quickly; production may want the default 2000.
# --tls-dir DIR serves clients over TLS only (secureClientPort, Netty; no plain client port):
# each client must show a certificate of the ensemble's CA (ssl.clientAuth=need), so a client
# without one cannot even connect, and the digest credentials no longer cross the network in
# clear. DIR holds ca.pem, server.pem (key and certificate, for the servers) and client.pem +
# client-key.pem (for streamnet: --zk-tls DIR); missing ones are made with openssl (a CA of
# this ensemble, certificates for 127.0.0.1, localhost and --bind). Quorum traffic between
# servers stays plain: keep an ensemble's peer ports on a private network.
# Server I logs to DIR/sI/zookeeper.log (INFO, timestamped, appended across restarts): the
# sessions it expires and why ("Expiring session 0x..., timeout of ...ms exceeded").
set -euo pipefail

cmd=${1:-}; shift || true
port=2181; dir=${STREAMNET_ZK_DIR:-$(pwd)/.run/zookeeper}; servers=1; tick=500; which=0; bind=127.0.0.1
client_ports=""; peer_ports=""; tls_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --port) port=$2; shift 2;;
    --dir) dir=$2; shift 2;;
    --servers) servers=$2; shift 2;;
    --tick-ms) tick=$2; shift 2;;
    --server) which=$2; shift 2;;
    --bind) bind=$2; shift 2;;
    --client-ports) client_ports=$2; shift 2;;
    --peer-ports) peer_ports=$2; shift 2;;
    --tls-dir) tls_dir=$(realpath -m "$2"); shift 2;;
    *) echo "zookeeper.sh: unknown option $1" >&2; exit 2;;
  esac
done
# slf4j-simple first: among the bindings under /usr/share/java the JVM may pick the no-op
# one (it did here), and the server then logs nothing - not even the sessions it expires
CP="/usr/share/java/slf4j-simple.jar:/usr/share/java/*:/etc/zookeeper/conf"

need_java() {
  if ! ls /usr/share/java/zookeeper*.jar >/dev/null 2>&1 || ! command -v java >/dev/null; then
    echo "zookeeper.sh: ZooKeeper is not installed; run: sudo apt-get install -y zookeeper" >&2
    exit 1
  fi
}

# the four-letter words go over TLS, with the client certificate, when the ensemble has --tls-dir
CONNECT_PY='
import socket, ssl, sys
def connect(host, port, tls):
    s = socket.create_connection((host, int(port)), timeout=1)
    if not tls:
        return s
    ctx = ssl.create_default_context(cafile=tls + "/ca.pem")
    ctx.check_hostname = False
    ctx.load_cert_chain(tls + "/client.pem", tls + "/client-key.pem")
    return ctx.wrap_socket(s)
'

ruok() {  # host port -> 0 if a server answers imok (it runs; it may not serve yet)
  python3 -c "$CONNECT_PY"'
try:
    s = connect(*sys.argv[1:4])
    s.sendall(b"ruok"); ok = s.recv(16) == b"imok"; s.close()
except OSError:
    ok = False
sys.exit(0 if ok else 1)
' "$1" "$2" "$tls_dir" 2>/dev/null
}

serving() {  # host port -> 0 if the server serves clients (standalone, or in a quorum)
  python3 -c "$CONNECT_PY"'
try:
    s = connect(*sys.argv[1:4])
    s.sendall(b"srvr"); out = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        out += chunk
    s.close()
    ok = b"Mode:" in out
except OSError:
    ok = False
sys.exit(0 if ok else 1)
' "$1" "$2" "$tls_dir" 2>/dev/null
}

make_tls() {  # the CA, the servers' and the clients' keys and certificates, where missing
  command -v openssl >/dev/null || { echo "zookeeper.sh: --tls-dir needs openssl" >&2; exit 1; }
  mkdir -p "$tls_dir"; chmod 700 "$tls_dir"
  local t=$tls_dir san="subjectAltName=IP:127.0.0.1,DNS:localhost" ext
  [ "$bind" != 127.0.0.1 ] && [ "$bind" != 0.0.0.0 ] && san="$san,IP:$bind"
  ( umask 077
    if [ ! -f "$t/ca.pem" ]; then
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=streamnet ZooKeeper CA" \
        -keyout "$t/ca-key.pem" -out "$t/ca.pem" 2>/dev/null
    fi
    for who in server client; do
      [ -f "$t/$who.pem" ] && continue
      openssl req -newkey rsa:2048 -nodes -subj "/CN=streamnet-$who" -keyout "$t/$who-key.pem" \
        -out "$t/$who.csr" 2>/dev/null
      # a server's certificate names the addresses clients dial and serves only as a server; a
      # client's names none and serves only as a client: a host holding client.pem cannot pose
      # as the ensemble to the other clients (streamnet checks the name and the purpose)
      if [ "$who" = server ]; then ext="$san"$'\n'"extendedKeyUsage=serverAuth"; else ext="extendedKeyUsage=clientAuth"; fi
      openssl x509 -req -in "$t/$who.csr" -CA "$t/ca.pem" -CAkey "$t/ca-key.pem" -CAcreateserial -days 825 \
        -extfile <(echo "$ext") -out "$t/$who-cert.pem" 2>/dev/null
      rm -f "$t/$who.csr"
      if [ "$who" = server ]; then   # ZooKeeper's PEM key store: the key and the certificate in one file
        cat "$t/server-key.pem" "$t/server-cert.pem" > "$t/server.pem"; rm -f "$t/server-key.pem" "$t/server-cert.pem"
      else
        mv "$t/client-cert.pem" "$t/client.pem"
      fi
    done )
}

cport() {  # index -> client port
  if [ -n "$client_ports" ]; then echo "$client_ports" | cut -d, -f$(($1 + 1)); else echo $((port + $1)); fi
}

pports() {  # index -> quorum:election ports
  if [ -n "$peer_ports" ]; then echo "$peer_ports" | cut -d, -f$(($1 + 1))
  else echo "$((port + 1000 + 2 * $1)):$((port + 1001 + 2 * $1))"; fi
}

write_config() {  # index
  local i=$1 d="$dir/s$1"
  mkdir -p "$d/data"
  {
    echo "tickTime=$tick"
    echo "initLimit=20"
    echo "syncLimit=10"
    echo "dataDir=$d/data"
    if [ -n "$tls_dir" ]; then
      echo "secureClientPort=$(cport "$i")"
      echo "secureClientPortAddress=$bind"
      echo "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory"
      echo "ssl.keyStore.location=$tls_dir/server.pem"
      echo "ssl.keyStore.type=PEM"
      echo "ssl.trustStore.location=$tls_dir/ca.pem"
      echo "ssl.trustStore.type=PEM"
      echo "ssl.clientAuth=need"
      # clients prove themselves by their CA-signed certificate, not by the address they come from
      echo "ssl.hostnameVerification=false"
    else
      echo "clientPort=$(cport "$i")"
      echo "clientPortAddress=$bind"
    fi
    echo "admin.enableServer=false"
    echo "4lw.commands.whitelist=ruok,srvr,stat,mntr"
    echo "maxClientCnxns=200"
    echo "autopurge.purgeInterval=1"
    if [ "$servers" -gt 1 ]; then
      for j in $(seq 0 $((servers - 1))); do
        echo "server.$((j + 1))=127.0.0.1:$(pports "$j")"
      done
    fi
  } > "$d/zoo.cfg"
  [ "$servers" -gt 1 ] && echo $((i + 1)) > "$d/data/myid"
  echo "$servers" > "$dir/servers"; echo "$port" > "$dir/port"; echo "$bind" > "$dir/bind"
  echo "$client_ports" > "$dir/client_ports"; echo "$peer_ports" > "$dir/peer_ports"; echo "$tls_dir" > "$dir/tls_dir"
}

start_one() {  # index
  local i=$1 d="$dir/s$1" main=org.apache.zookeeper.server.ZooKeeperServerMain
  [ "$servers" -gt 1 ] && main=org.apache.zookeeper.server.quorum.QuorumPeerMain
  if [ -f "$d/pid" ] && kill -0 "$(cat "$d/pid")" 2>/dev/null; then return 0; fi
  if ruok "$(probe_host)" "$(cport "$i")"; then
    echo "zookeeper.sh: port $(cport "$i") already has a ZooKeeper that is not ours ($dir); pick --port" >&2
    exit 1
  fi
  # setsid: the server outlives the shell that started it and gets its own process group
  setsid java -Xmx256m -Dzookeeper.log.dir="$d" -Dzookeeper.root.logger=INFO,CONSOLE \
    -Dorg.slf4j.simpleLogger.showDateTime=true -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
    -cp "$CP" "$main" "$d/zoo.cfg" >> "$d/zookeeper.log" 2>&1 < /dev/null &
  echo $! > "$d/pid"
}

died() {  # index -> 0 if the server's process is gone
  [ -f "$dir/s$1/pid" ] && ! kill -0 "$(cat "$dir/s$1/pid")" 2>/dev/null
}

wait_up() {
  local deadline=$((SECONDS + 60)) i j
  for i in $(seq 0 $((servers - 1))); do
    until serving "$(probe_host)" "$(cport "$i")"; do
      for j in $(seq 0 $((servers - 1))); do
        if died "$j"; then
          echo "zookeeper.sh: server $j (client port $(cport "$j"), quorum ports $(pports "$j")) exited; log:" >&2
          tail -20 "$dir/s$j/zookeeper.log" >&2; exit 1
        fi
      done
      if [ $SECONDS -ge $deadline ]; then
        echo "zookeeper.sh: server $i is not serving on port $(cport "$i") after 60 s; log:" >&2
        tail -20 "$dir/s$i/zookeeper.log" >&2; exit 1
      fi
      sleep 0.2
    done
  done
}

probe_host() { if [ "$bind" = 0.0.0.0 ]; then echo 127.0.0.1; else echo "$bind"; fi; }

connect_string() {
  local s="" i
  for i in $(seq 0 $((servers - 1))); do s="$s${s:+,}$(probe_host):$(cport "$i")"; done
  echo "$s"
}

load_layout() {
  [ -f "$dir/servers" ] && servers=$(cat "$dir/servers")
  [ -f "$dir/port" ] && port=$(cat "$dir/port")
  [ -f "$dir/bind" ] && bind=$(cat "$dir/bind")
  [ -f "$dir/client_ports" ] && client_ports=$(cat "$dir/client_ports")
  [ -f "$dir/peer_ports" ] && peer_ports=$(cat "$dir/peer_ports")
  [ -f "$dir/tls_dir" ] && tls_dir=$(cat "$dir/tls_dir")
  return 0
}

case "$cmd" in
  start)
    need_java
    [ -n "$tls_dir" ] && make_tls
    for i in $(seq 0 $((servers - 1))); do write_config "$i"; start_one "$i"; done
    wait_up
    connect_string;;
  stop)
    load_layout
    for i in $(seq 0 $((servers - 1))); do
      pidf="$dir/s$i/pid"
      if [ -f "$pidf" ]; then
        pid=$(cat "$pidf")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidf"
      fi
    done;;
  kill)
    load_layout
    pidf="$dir/s$which/pid"; [ -f "$pidf" ] && kill -9 "$(cat "$pidf")" 2>/dev/null || true
    rm -f "$pidf";;
  restart-server)
    load_layout
    start_one "$which"
    until ruok "$(probe_host)" "$(cport "$which")"; do
      if died "$which"; then echo "zookeeper.sh: server $which exited; log:" >&2; tail -20 "$dir/s$which/zookeeper.log" >&2; exit 1; fi
      sleep 0.2
    done;;
  status)
    load_layout
    rc=0
    for i in $(seq 0 $((servers - 1))); do
      if serving "$(probe_host)" "$(cport "$i")"; then echo "server $i on $(probe_host):$(cport "$i"): serving"
      elif ruok "$(probe_host)" "$(cport "$i")"; then echo "server $i on $(probe_host):$(cport "$i"): up, not serving (no quorum?)"; rc=3
      else echo "server $i on $(probe_host):$(cport "$i"): down"; rc=3; fi
    done
    exit $rc;;
  *)
    sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 2;;
esac
