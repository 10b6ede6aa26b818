"""Keep-alive client: N sequential GETs on one connection; checks every status.

    client.py PORT N PATH STATUS [KEY [PRINT]]
PATH may be @FILE (a path a line, taken in turn); STATUS may list several (200,422)."""
import socket, sys
port, n, path, status = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
auth = sys.argv[5] if len(sys.argv) > 5 else ""
paths = [l for l in open(path[1:]).read().splitlines() if l] if path.startswith("@") else [path]
ok = set(status.split(","))
def request(p):
    req = f"GET {p} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: hp\r\nAccept: */*\r\n"
    if auth:
        req += f"Authorization: Bearer {auth}\r\n"
    return (req + "\r\n").encode()
reqs = [request(p) for p in paths]
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""
last = b""
for i in range(n):
    s.sendall(reqs[i % len(reqs)])
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d: raise SystemExit(f"closed at {i}")
        buf += d
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    st = lines[0].split()[1].decode()
    if st not in ok: raise SystemExit(f"status {st} at {i} ({paths[i % len(paths)]}): {head!r}")
    cl = 0
    for l in lines[1:]:
        k, v = l.split(b":", 1)
        if k.strip().lower() == b"content-length": cl = int(v)
    while len(buf) < cl:
        d = s.recv(65536)
        if not d: raise SystemExit("closed in body")
        buf += d
    body, buf = buf[:cl], buf[cl:]
    last = head + b"\r\n\r\n" + body
s.close()
if len(sys.argv) > 6: print(last.decode(errors="replace"))
