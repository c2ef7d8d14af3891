"""bench/wan_proxy.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT [DELAY_MS]

A TCP forwarder with a one-way delay line in each direction, for
bench/wan_dock.sh: this kernel has no netem, so propagation delay between
the emulated datacenters is added here (each chunk read is written
DELAY_MS after it arrived, so the delay adds latency without capping
throughput).  Also lets a server that binds 127.0.0.1 (the strict S3 test
server) be reached from another network namespace.  Prints "listening"
when ready; runs until killed.
"""
import collections
import socket
import sys
import threading
import time


def pump(src, dst, delay):
    q = collections.deque()
    cv = threading.Condition()
    done = [False]

    def reader():
        try:
            while True:
                b = src.recv(65536)
                with cv:
                    q.append((time.monotonic() + delay, b))
                    cv.notify()
                if not b:
                    return
        except OSError:
            with cv:
                q.append((0, b""))
                cv.notify()

    threading.Thread(target=reader, daemon=True).start()
    try:
        while not done[0]:
            with cv:
                while not q:
                    cv.wait()
                t, b = q.popleft()
            wait = t - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not b:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(b)
    except OSError:
        pass


def serve(conn, target, delay):
    try:
        up = socket.create_connection(target)
    except OSError:
        conn.close()
        return
    for s in (conn, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    a = threading.Thread(target=pump, args=(conn, up, delay), daemon=True)
    b = threading.Thread(target=pump, args=(up, conn, delay), daemon=True)
    a.start()
    b.start()
    a.join()
    b.join()
    conn.close()
    up.close()


def main():
    host, port, thost, tport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    delay = (float(sys.argv[5]) if len(sys.argv) > 5 else 0.0) / 1000.0
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((host, port))
    ls.listen(256)
    print("listening", flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c, (thost, tport), delay), daemon=True).start()


if __name__ == "__main__":
    main()
