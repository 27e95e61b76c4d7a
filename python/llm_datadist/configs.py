"""Roles, cluster addresses and the configuration (CANN's ``llm_datadist.configs``):
``LLMRole``, ``LLMClusterInfo``, ``LlmConfig`` (also ``LLMConfig``) whose
``generate_options()`` gives the option dict ``LLMDataDist.init`` takes, with CANN's keys."""

import json
import socket
from enum import IntEnum
from typing import List, Tuple, Union

from llm_datadist.status import raise_if_false
from llm_datadist.utils.utils import (
    check_dict,
    check_int32,
    check_isinstance,
    check_uint16,
    check_uint64,
)


class LLMRole(IntEnum):
    """A cluster's role."""

    PROMPT = 1
    DECODER = 2
    MIX = 3

    def __str__(self):
        return f"{self.__class__.__name__}.{self.name}"


def trans_str_ip(ip):
    """An IPv4 address as CANN's wrapper takes it: text → int, first octet in the low byte
    (``inet_aton``, little-endian); an int passes as it is."""
    if isinstance(ip, str):
        try:
            return int.from_bytes(socket.inet_aton(ip), byteorder="little")
        except OSError:
            raise RuntimeError(f"Can not parse ip str:{ip}")
    return ip


def ip_int_to_str(ip: int) -> str:
    """The text of an IPv4 address packed as ``trans_str_ip`` packs it."""
    return socket.inet_ntoa(int(ip).to_bytes(4, byteorder="little"))


class LLMClusterInfo:
    """A peer cluster to link or unlink: its id, role, and addresses (``append_*_ip_info``)."""

    def __init__(self):
        self._remote_cluster_id = None
        self._remote_role_type = None
        self._local_ip_info_list: List[Tuple[int, int]] = []
        self._remote_ip_info_list: List[Tuple[int, int]] = []

    @staticmethod
    def _check_inputs(ip, port):
        check_isinstance("ip", ip, [str, int], allow_none=False)
        check_uint16("port", port)
        return trans_str_ip(ip)

    @property
    def remote_role_type(self):
        return self._remote_role_type

    @remote_role_type.setter
    def remote_role_type(self, remote_role_type: Union[LLMRole, int]):
        check_isinstance("remote_role_type", remote_role_type, [LLMRole, int])
        self._remote_role_type = remote_role_type

    @property
    def remote_cluster_id(self):
        return self._remote_cluster_id

    @remote_cluster_id.setter
    def remote_cluster_id(self, remote_cluster_id):
        check_uint64("remote_cluster_id", remote_cluster_id)
        self._remote_cluster_id = remote_cluster_id

    @property
    def local_ip_info_list(self):
        return self._local_ip_info_list

    @property
    def remote_ip_info_list(self):
        return self._remote_ip_info_list

    def append_local_ip_info(self, ip: Union[str, int], port: int):
        """Adds an address of this side (informative)."""
        self._local_ip_info_list.append((self._check_inputs(ip, port), port))

    def append_remote_ip_info(self, ip: Union[str, int], port: int):
        """Adds the peer's listen address (exactly one to link)."""
        self._remote_ip_info_list.append((self._check_inputs(ip, port), port))

    def _pack(self):
        raise_if_false(self._remote_cluster_id is not None, "remote_cluster_id is not set")
        role = int(self._remote_role_type) if self._remote_role_type is not None else 0
        return (
            self._remote_cluster_id,
            role,
            [(ip_int_to_str(ip), port) for ip, port in self._local_ip_info_list],
            [(ip_int_to_str(ip), port) for ip, port in self._remote_ip_info_list],
        )

    def __repr__(self):
        return (f"LLMClusterInfo(remote_cluster_id={self._remote_cluster_id}, "
                f"remote_role_type={self._remote_role_type}, "
                f"local_ip_info_list={self._local_ip_info_list}, "
                f"remote_ip_info_list={self._remote_ip_info_list})")


def _prop(name, check=None):
    """A read-write attribute stored as ``_name``, checked by ``check(value)`` when set."""

    def get(self):
        return getattr(self, "_" + name)

    def set_(self, v):
        if check is not None:
            check(v)
        setattr(self, "_" + name, v)

    return property(get, set_)


def _check_bool(name):
    return lambda v: check_isinstance(name, v, bool)


def _check_str(name):
    return lambda v: check_isinstance(name, v, str)


def _check_int_range(name, lo, hi):
    def check(v):
        check_isinstance(name, v, int)
        if v is not None:
            raise_if_false(lo <= v <= hi, "{0} ({1}) should be in [{2}, {3}]", name, v, lo, hi)

    return check


class LlmConfig:
    """LLM-DataDist's configuration: set the attributes, then ``generate_options()``."""

    def __init__(self):
        self._options = {}
        self._ge_options = {}
        self._device_id = None
        self._listen_ip_info = None
        self._deploy_res_path = None
        self._buf_pool_cfg = None
        self._output_max_size = None
        self._mem_utilization = None
        self._cluster_info = None
        self._sync_kv_timeout = None
        self._enable_switch_role = False
        self._link_total_time = None
        self._link_retry_count = None
        self._enable_cache_manager = None
        self._enable_remote_cache_accessible = None
        self._mem_pool_cfg = None
        self._host_mem_pool_cfg = None
        self._rdma_traffic_class = None
        self._rdma_service_level = None
        self._local_comm_res = None
        self._transfer_backend = None
        self._global_resource_config = None

    def generate_options(self):
        """The option dict (CANN's keys: ``ge.exec.deviceId``, ``llm.listenIpInfo``,
        ``llm.SyncKvCacheWaitTime``, ``llm.LocalCommRes`` ...)."""
        return self.gen_options()

    def gen_options(self):
        o = self._options
        o.update(self._ge_options)
        if self._device_id is not None:
            if isinstance(self._device_id, int):
                o["ge.exec.deviceId"] = str(self._device_id)
                o["ge.session_device_id"] = str(self._device_id)
            else:
                o["ge.session_device_id"] = str(self._device_id[0])
                o["ge.exec.deviceId"] = ";".join(str(d) for d in self._device_id)
        if self._sync_kv_timeout is not None:
            o["llm.SyncKvCacheWaitTime"] = str(self._sync_kv_timeout)
        if self._deploy_res_path:
            o["llm.deployResPath"] = str(self._deploy_res_path)
        if self._buf_pool_cfg:
            o["llm.BufPoolCfg"] = str(self._buf_pool_cfg)
        if self._mem_pool_cfg:
            o["llm.MemPoolConfig"] = str(self._mem_pool_cfg)
        if self._host_mem_pool_cfg:
            o["llm.HostMemPoolConfig"] = str(self._host_mem_pool_cfg)
        if self._enable_cache_manager is not None:
            o["llm.EnableCacheManager"] = "1" if self._enable_cache_manager else "0"
        if self._enable_remote_cache_accessible is not None:
            o["llm.EnableRemoteCacheAccessible"] = "1" if self._enable_remote_cache_accessible else "0"
        if self._listen_ip_info:
            o["llm.listenIpInfo"] = str(self._listen_ip_info)
        if self._link_total_time is not None:
            o["llm.LinkTotalTime"] = str(self._link_total_time)
        if self._link_retry_count is not None:
            o["llm.LinkRetryCount"] = str(self._link_retry_count)
        if self._rdma_traffic_class is not None:
            o["llm.RdmaTrafficClass"] = str(self._rdma_traffic_class)
        if self._rdma_service_level is not None:
            o["llm.RdmaServiceLevel"] = str(self._rdma_service_level)
        if self._local_comm_res is not None:
            o["llm.LocalCommRes"] = str(self._local_comm_res)
        if self._transfer_backend is not None:
            o["llm.TransferBackend"] = str(self._transfer_backend)
        if self._global_resource_config is not None:
            o["llm.GlobalResourceConfig"] = str(self._global_resource_config)
        if self._cluster_info:
            o["llm.ClusterInfo"] = str(self._cluster_info)
        if self._output_max_size is not None:
            o["llm.OutputMaxSize"] = str(self._output_max_size)
        if self._enable_switch_role:
            o["llm.EnableSwitchRole"] = "1"
        if self._mem_utilization is not None:
            o["llm.MemoryUtilization"] = str(self._mem_utilization)
        return o

    @property
    def options(self):
        return self._options

    @property
    def ge_options(self):
        return self._ge_options

    @ge_options.setter
    def ge_options(self, ge_options):
        check_isinstance("ge_options", ge_options, dict, allow_none=False)
        check_dict("ge_options", ge_options, str, str)
        self._ge_options = ge_options

    @property
    def device_id(self):
        return self._device_id

    @device_id.setter
    def device_id(self, device_id):
        check_isinstance("device_id", device_id, [list, tuple, int])
        ids = device_id if isinstance(device_id, (list, tuple)) else [device_id]
        for d in ids:
            check_isinstance("device_id", d, int, allow_none=False)
            raise_if_false(d >= 0, "device_id should be greater than or equal to zero.")
            check_int32("device_id", d)
        self._device_id = device_id

    @property
    def sync_kv_timeout(self):
        return self._sync_kv_timeout

    @sync_kv_timeout.setter
    def sync_kv_timeout(self, v):
        check_isinstance("sync_kv_timeout", v, [int, str])
        if isinstance(v, str):
            raise_if_false(v.isdigit(), "sync_kv_timeout must be digit.")
        raise_if_false(int(v) > 0, "sync_kv_timeout should be greater than zero.")
        check_int32("sync_kv_timeout", int(v))
        self._sync_kv_timeout = v

    @property
    def cluster_info(self):
        return self._cluster_info

    @cluster_info.setter
    def cluster_info(self, cluster_info):
        check_isinstance("cluster_info", cluster_info, str)
        d = json.loads(cluster_info)
        for ip_info in d.get("listen_ip_info", []):
            ip_info["ip"] = trans_str_ip(ip_info["ip"])
        self._cluster_info = json.dumps(d)

    @property
    def mem_utilization(self):
        return self._mem_utilization

    @mem_utilization.setter
    def mem_utilization(self, v):
        check_isinstance("mem_utilization", v, [float, int])
        raise_if_false(0 < v <= 1, "mem_utilization should be in (0, 1]")
        self._mem_utilization = v

    listen_ip_info = _prop("listen_ip_info", _check_str("listen_ip_info"))
    deploy_res_path = _prop("deploy_res_path", _check_str("deploy_res_path"))
    buf_pool_cfg = _prop("buf_pool_cfg", _check_str("buf_pool_cfg"))
    output_max_size = _prop("output_max_size", _check_int_range("output_max_size", 1, 2**63 - 1))
    enable_switch_role = _prop("enable_switch_role", _check_bool("enable_switch_role"))
    link_total_time = _prop("link_total_time", _check_int_range("link_total_time", 0, 2**31 - 1))
    link_retry_count = _prop("link_retry_count", _check_int_range("link_retry_count", 1, 100))
    enable_cache_manager = _prop("enable_cache_manager", _check_bool("enable_cache_manager"))
    enable_remote_cache_accessible = _prop(
        "enable_remote_cache_accessible", _check_bool("enable_remote_cache_accessible")
    )
    mem_pool_cfg = _prop("mem_pool_cfg", _check_str("mem_pool_cfg"))
    host_mem_pool_cfg = _prop("host_mem_pool_cfg", _check_str("host_mem_pool_cfg"))
    rdma_traffic_class = _prop("rdma_traffic_class", _check_int_range("rdma_traffic_class", 0, 255))
    rdma_service_level = _prop("rdma_service_level", _check_int_range("rdma_service_level", 0, 7))
    local_comm_res = _prop("local_comm_res", _check_str("local_comm_res"))
    transfer_backend = _prop("transfer_backend", _check_str("transfer_backend"))
    global_resource_config = _prop("global_resource_config", _check_str("global_resource_config"))


LLMConfig = LlmConfig
