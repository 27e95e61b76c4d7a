"""Option parsing of the cache manager (CANN's ``llm_datadist.v2.config``, reduced to what the
cache-manager mode uses)."""

from llm_datadist.status import raise_if_false
from llm_datadist.utils.utils import check_isinstance


def parse_listen_ip_info(listen_ip_info: str):
    """``"ip:port"`` → ``(ip, port)``; ``LLM_PARAM_INVALID`` for anything else."""
    check_isinstance("listen_ip_info", listen_ip_info, str, allow_none=False)
    ip, sep, port = listen_ip_info.rpartition(":")
    raise_if_false(sep == ":" and ip != "" and port.isdigit() and int(port) < 65536,
                   'llm.listenIpInfo "{0}" is invalid, format should be "ip:port"', listen_ip_info)
    return ip.strip("[]"), int(port)
