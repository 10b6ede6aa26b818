"""Keep-alive client: N sequential GETs on one connection; checks every status."""
import socket, sys
port, n, path, status = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
auth = sys.argv[5] if len(sys.argv) > 5 else ""
req = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: hp\r\nAccept: */*\r\n"
if auth:
    req += f"Authorization: Bearer {auth}\r\n"
req = (req + "\r\n").encode()
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
buf = b""
last = b""
for i in range(n):
    s.sendall(req)
    while b"\r\n\r\n" not in buf:
        d = s.recv(65536)
        if not d: raise SystemExit(f"closed at {i}")
        buf += d
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    st = lines[0].split()[1].decode()
    if st != status: raise SystemExit(f"status {st} at {i}: {head!r}")
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
