/*
 * llm_datadist/llm_engine_types.h: LLM-DataDist's role names and GE-level option keys (namespace
 * llm), as CANN's header of that name gives them. Source-compatible with CANN's.
 */
#ifndef LLM_ENGINE_INC_EXTERNAL_LLM_ENGINE_TYPES_H
#define LLM_ENGINE_INC_EXTERNAL_LLM_ENGINE_TYPES_H  // CANN's guard: one of the two is used

namespace llm {
constexpr const char kPrompt[] = "Prompt";
constexpr const char kDecoder[] = "Decoder";

constexpr const char LLM_OPTION_CLUSTER_INFO[] = "llm.ClusterInfo";
constexpr const char LLM_OPTION_ROLE[] = "llm.Role";
constexpr const char LLM_OPTION_SYNC_KV_CACHE_WAIT_TIME[] = "llm.SyncKvCacheWaitTime";
constexpr const char LLM_OPTION_OUTPUT_MAX_SIZE[] = "llm.OutputMaxSize";
constexpr const char LLM_OPTION_ENABLE_SWITCH_ROLE[] = "llm.EnableSwitchRole";
constexpr const char LLM_OPTION_BUF_POOL_CFG[] = "llm.BufPoolCfg";
}  // namespace llm

#endif  // LLM_ENGINE_INC_EXTERNAL_LLM_ENGINE_TYPES_H
