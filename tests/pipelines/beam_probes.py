"""Probes for Beam tests: what a pipeline's worker sees of the runner process."""


def listening_probe(runner_pid):
    """A function for a worker: the addresses the runner process (``runner_pid``) listens on while the
    pipeline runs. Nested, so that Beam pickles it by value (this test module is not importable there)."""
    def listening(_):
        import psutil
        return sorted({(c.laddr.ip, c.laddr.port) for c in psutil.Process(runner_pid).net_connections("inet")
                       if c.status == psutil.CONN_LISTEN})
    return listening


def is_loopback(ip):
    import ipaddress
    address = ipaddress.ip_address(ip)
    return address.is_loopback or bool(getattr(address, "ipv4_mapped", None) and address.ipv4_mapped.is_loopback)
