"""``LLMDataDist`` (CANN's ``llm_datadist.v2.llm_datadist``): one per process, a cluster in a
role, over hixl's engine: ``init``, ``link_clusters`` / ``unlink_clusters`` (by listen
address), ``link`` / ``query_register_mem_status`` / ``unlink`` (by rank table),
``switch_role``, ``cache_manager``, ``finalize`` (also at interpreter exit)."""

import atexit
import copy
import json
from typing import Dict, List, Optional, Tuple, Union

from hixl._hixl import datadist as _native
from llm_datadist.configs import LLMClusterInfo, LLMRole
from llm_datadist.status import (
    LLMException,
    LLMStatusCode,
    code_2_status,
    handle_llm_status,
    raise_if_false,
    raise_if_true,
)
from llm_datadist.utils import log
from llm_datadist.utils.utils import check_dict, check_isinstance, check_uint32, check_uint64
from llm_datadist.v2.cache_manager import CacheManager
from llm_datadist.v2.config import parse_listen_ip_info
from llm_datadist.v2.llm_types import RegisterMemStatus

_MAX_CLUSTER_NAME = 128
_MAX_NODE_NUM = 4
_MAX_COMMS = 512


class LLMDataDist:
    """A cluster: ``LLMDataDist(role, cluster_id)``, then ``init(options)``."""

    llm_engine_instance = None

    def __init__(self, role: LLMRole, cluster_id: int):
        check_isinstance("role", role, LLMRole, allow_none=False)
        check_uint64("cluster_id", cluster_id)
        self._role = role
        self._cluster_id = cluster_id
        self._native = None
        self._cache_manager = None
        self._engine_options: Dict[str, str] = {}
        self._is_initialized = False
        self._comms = set()

    def _native_options(self, options: Dict[str, str]) -> Dict[str, str]:
        """The options as CANN's `init` rewrites them, for the native instance."""
        o = dict(options)
        o["llm.Role"] = {LLMRole.PROMPT: "Prompt", LLMRole.DECODER: "Decoder", LLMRole.MIX: "Mix"}[self._role]
        if "llm.LocalCommRes" in options:
            o.setdefault("llm.EnableCacheManager", "1")
            o.setdefault("llm.EnableRemoteCacheAccessible", "1")
        if "llm.TransferBackend" in options:
            o.setdefault("llm.EnableRemoteCacheAccessible", "1")
            raise_if_false(o["llm.EnableRemoteCacheAccessible"] == "1",
                           "llm.TransferBackend is not supported when llm.EnableRemoteCacheAccessible is not enable.")
            raise_if_false("llm.listenIpInfo" in options,
                           "llm.TransferBackend is not supported when llm.listenIpInfo is not configured.")
        if "llm.listenIpInfo" in options:
            ip, port = parse_listen_ip_info(options["llm.listenIpInfo"])
            o["llm.ListenIp"], o["llm.ListenPort"] = ip, str(port)
            del o["llm.listenIpInfo"]
        # the device: ge.session_device_id, or the first of ge.exec.deviceId ("0;1" for several)
        dev = o.pop("ge.exec.deviceId", None)
        dev = o.get("ge.session_device_id", dev)
        if dev is not None and "llm.DeviceId" not in o:
            o["llm.DeviceId"] = str(dev).split(";")[0]
        return o

    def init(self, options: Dict[str, str]) -> None:
        """Initializes the cluster: its engine (listening on ``llm.listenIpInfo`` where given),
        the device of ``ge.exec.deviceId`` made current. Twice: nothing happens."""
        if self._is_initialized:
            return
        raise_if_false(LLMDataDist.llm_engine_instance is None, "Cannot init multiple LLMDataDists",
                       status_code=LLMStatusCode.LLM_FAILED)
        check_isinstance("options", options, dict, allow_none=False)
        check_dict("options", options, str, str)
        self._engine_options = self._native_options(options)
        log.info("LLMDatadist init options = %s", self._engine_options)
        native = _native.DataDist(self._cluster_id, int(self._role))
        ret = native.initialize(self._engine_options)
        handle_llm_status(ret, "[LLMDataDist.init]", f"Failed to initialize llm datadist, options = {options}")
        self._native = native
        self._cache_manager = CacheManager(native, self._engine_options)
        try:
            self._cache_manager._open_pools()
        except BaseException:
            native.finalize()
            self._cache_manager._close_pools()
            self._native = None
            raise
        LLMDataDist.llm_engine_instance = self
        self._is_initialized = True

    def _check_is_inited(self):
        raise_if_false(self._is_initialized, "llm datadist is not initialized", status_code=LLMStatusCode.LLM_FAILED)

    def finalize(self) -> None:
        """Unlinks everything, unregisters every cache, stops the engine. Safe twice."""
        if not self._is_initialized:
            return
        self._comms.clear()  # the native finalize unlinks every communicator
        self._native.finalize()
        if self._cache_manager is not None:
            self._cache_manager._initialized = False
            # after the native finalize: no peer reaches the pools any more
            self._cache_manager._close_pools()
        self._is_initialized = False
        LLMDataDist.llm_engine_instance = None

    @property
    def cache_manager(self) -> CacheManager:
        self._check_is_inited()
        return self._cache_manager

    @property
    def kv_cache_manager(self):
        raise LLMException("kv_cache_manager belongs to the non cache-manager mode, which this package has not",
                           status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)

    @property
    def cluster_id(self):
        return self._cluster_id

    # ---- links by listen address ----

    @staticmethod
    def _statuses(func, ret, rets):
        """A link call's ``(status, [status per cluster])``; a call refused before the clusters
        (a timeout not above 0, not an int32: the instance's rules) raises."""
        if rets is None:
            handle_llm_status(ret, f"[{func}]", "the call was refused")
        return code_2_status(ret), [code_2_status(r) for r in rets]

    def link_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo]], timeout=3000):
        """Links to each cluster's listen address (its one remote ip info) by `timeout` ms:
        ``(status, [status per cluster])``, the status the last failure (no exception)."""
        self._check_is_inited()
        check_isinstance("clusters", clusters, [list, tuple], LLMClusterInfo, allow_none=False)
        ret, rets = self._native.link_clusters([c._pack() for c in clusters], timeout)
        return self._statuses("link_clusters", ret, rets)

    def unlink_clusters(self, clusters: Union[List[LLMClusterInfo], Tuple[LLMClusterInfo]], timeout=3000,
                        force=False):
        """Unlinks each cluster: ``(status, [status per cluster])``. A cluster not linked from
        here is ``LLM_NOT_YET_LINK``, except with `force`, where it succeeds: the side a peer
        linked to holds no link of its own (hixl's links are one-directional), so there is
        nothing to tear down, as CANN's force unlink of the listening half."""
        self._check_is_inited()
        check_isinstance("clusters", clusters, [list, tuple], LLMClusterInfo, allow_none=False)
        check_isinstance("force", force, bool)
        ret, rets = self._native.unlink_clusters([c._pack() for c in clusters], timeout, bool(force))
        ret, rets = self._statuses("unlink_clusters", ret, rets)
        if force:
            rets = [LLMStatusCode.LLM_SUCCESS if r == LLMStatusCode.LLM_NOT_YET_LINK else r for r in rets]
            failed = [r for r in rets if r != LLMStatusCode.LLM_SUCCESS]
            ret = failed[-1] if failed else (LLMStatusCode.LLM_SUCCESS if rets else code_2_status(ret))
        return code_2_status(ret), rets

    def switch_role(self, role: LLMRole, switch_options: Optional[Dict[str, str]] = None):
        """Changes the role; with ``llm.listenIpInfo`` in `switch_options` the cluster listens
        there from now on (refused with ``LLM_EXIST_LINK`` while links exist)."""
        self._check_is_inited()
        check_isinstance("role", role, LLMRole, allow_none=False)
        check_isinstance("switch_options", switch_options, dict)
        options = dict(switch_options) if switch_options is not None else {}
        if "llm.listenIpInfo" in options:
            ip, port = parse_listen_ip_info(options.pop("llm.listenIpInfo"))
            options["llm.ListenIp"], options["llm.ListenPort"] = ip, str(port)
        ret = self._native.set_role(int(role), options)
        handle_llm_status(ret, "[switch_role]", f"Failed to switch role, role = {role}, options = {options}")
        log.info("[switch_role] [%s->%s] success", self._role.name, role.name)
        self._role = role

    # ---- links by rank table (CANN's HCCL communicator mode) ----

    def link(self, comm_name: str, cluster_rank_info: Dict[int, int], rank_table: str) -> int:
        """CANN's explicit-rank-table link: the communicator the rank table describes for this
        cluster's rank is made now (HCCL's ``HcclCommInitClusterInfoMemConfig``), then, in the
        background, ``HcclCommPrepare`` and, with each peer rank, ``HcclExchangeMemDesc`` swap
        each side's engine address and cache table; the engines then link to each other, so
        pulls and pushes work from every side, as on CANN's communicator. A cluster without
        ``listen_ip_info`` listens on an ephemeral port of its rank's server from its first such
        link. ``query_register_mem_status(comm_id)`` says ``PREPARING``, then ``OK`` (or
        ``FAILED``: a peer that never joins within ``llm.LinkTotalTime`` seconds, 30 by
        default). Returns the comm id (from 1)."""
        self._check_is_inited()
        check_isinstance("comm_name", comm_name, str, allow_none=False)
        raise_if_true(len(comm_name) == 0, "comm_name can not be empty")
        raise_if_false(len(comm_name) < _MAX_CLUSTER_NAME, "comm_name length should be smaller than 128.")
        check_isinstance("cluster_rank_info", cluster_rank_info, dict, allow_none=False)
        check_dict("cluster_rank_info", cluster_rank_info, int, int)
        raise_if_false(len(cluster_rank_info) <= _MAX_NODE_NUM, "cluster_rank_info size can not be greater than 4.")
        for k, v in cluster_rank_info.items():
            check_uint64("cluster_rank_info key", k)
            check_uint32("cluster_rank_info value", v)
        check_isinstance("rank_table", rank_table, str, allow_none=False)
        ranks = list(cluster_rank_info.values())
        raise_if_false(len(ranks) > 1, "cluster num must be bigger than 1.")
        raise_if_false(ranks == sorted(copy.copy(ranks)), "rank in cluster_rank_info must be ordered")
        raise_if_true(self._engine_options.get("llm.TransferBackend") == "hixl",
                      "[link] a rank table with llm.TransferBackend=hixl (link clusters with link_clusters)",
                      status_code=LLMStatusCode.LLM_FEATURE_NOT_ENABLED)
        raise_if_false(self._cluster_id in cluster_rank_info, "[link] cluster {0} is not in cluster_rank_info",
                       self._cluster_id)
        in_table = _rank_ids(rank_table)
        for cid, rank in cluster_rank_info.items():
            raise_if_false(rank in in_table, "[link] rank {0} (cluster {1}) is not in the rank table", rank, cid)
        ret, comm_id = self._native.link_comm(comm_name, sorted(cluster_rank_info.items(), key=lambda kv: kv[1]),
                                              rank_table)
        handle_llm_status(ret, "[link]", f"comm {comm_name}, clusters {cluster_rank_info}")
        self._comms.add(comm_id)
        self._cache_manager.set_is_call_linked()
        log.info("[link] comm %s, id %d", comm_name, comm_id)
        return comm_id

    def _comm(self, comm_id):
        self._check_is_inited()
        check_isinstance("comm_id", comm_id, int, allow_none=False)
        check_uint64("comm_id", comm_id)
        raise_if_false(comm_id in self._comms, "comm_id {0} is not a communicator of this LLMDataDist", comm_id)
        return comm_id

    def unlink(self, comm_id: int):
        """Unlinks the clusters ``link`` linked for `comm_id` and destroys its communicator
        (waiting for a link still being made to give up)."""
        self._comm(comm_id)
        ret = self._native.unlink_comm(comm_id)
        self._comms.discard(comm_id)
        handle_llm_status(ret, "[unlink]", f"comm_id {comm_id}")

    def query_register_mem_status(self, comm_id: int) -> RegisterMemStatus:
        """``PREPARING`` while the links of `comm_id` are being made, then ``OK`` or ``FAILED``."""
        self._comm(comm_id)
        ret, value = self._native.query_register_mem_status(comm_id)
        handle_llm_status(ret, "[query_register_mem_status]", f"comm_id {comm_id}")
        return RegisterMemStatus(value)


def _rank_ids(rank_table: str):
    """The rank ids of a rank table (versions 1.0 and 1.2)."""
    try:
        table = json.loads(rank_table)
        return {int(dev["rank_id"]) for server in table["server_list"] for dev in server["device"]}
    except (ValueError, KeyError, TypeError) as e:
        raise LLMException(f"[link] rank_table is not a rank table: {e}", status_code=LLMStatusCode.LLM_PARAM_INVALID)


def _shutdown_handler():
    inst = LLMDataDist.llm_engine_instance
    if inst is not None:
        try:
            inst.finalize()
        except LLMException as e:
            log.warn(f"error occurred while finalize llm datadist: {e}")


atexit.register(_shutdown_handler)
