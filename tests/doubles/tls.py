"""The tests' HTTPS doubles serve with the simulator's throwaway CA (bridge.simulator.tls)."""

from bridge.simulator.tls import ServerCertificate, ThrowawayCertificate, make_server_certificate

__all__ = ["ServerCertificate", "ThrowawayCertificate", "make_server_certificate"]
