//! The options of a fabric-memory engine, as HIXL checks them: its keys, `BufferPool` `"0:0"`,
//! and the host-copy path only (the AICPU path is refused, saying why).

use crate::error::Error;
use crate::transport::ascend::options::AscendOptions;

/// Why the AICPU path is refused.
pub(crate) const NO_AICPU: &str = "fabric memory's AICPU path (GlobalResourceConfig \
     fabric_memory.enable_aicpu_unfold=true) needs HIXL's AICPU kernels (libcann_hixl_kernel.so), \
     which hixl does not have; set it to false (or leave it unset) for the host-copy path";

/// The options keys HIXL accepts with `EnableUseFabricMem=1` (canonical names; hixl's own
/// `hixl.*` keys are accepted too).
const FABRIC_KEYS: &[&str] = &[
    "EnableUseFabricMem",
    "RdmaTrafficClass",
    "RdmaServiceLevel",
    "LocalCommRes",
    "BufferPool",
    "AutoConnect",
    "GlobalResourceConfig",
];

/// Checks HIXL's rules for the options of a fabric-memory engine: only [`FABRIC_KEYS`] (and
/// hixl's own), `BufferPool` `"0:0"` if given, and the host-copy path.
///
/// # Errors
/// [`Error::InvalidOption`] (`PARAM_INVALID`) for another key or another buffer pool;
/// [`Error::UnsupportedOption`] (`UNSUPPORTED`) for the AICPU path.
pub(crate) fn check_options(
    hixl: &std::collections::BTreeMap<String, String>,
    o: &AscendOptions,
) -> Result<(), Error> {
    for (k, v) in hixl {
        if k.starts_with("hixl.") || FABRIC_KEYS.contains(&k.as_str()) {
            if k == "BufferPool" && v != "0:0" {
                return Err(Error::InvalidOption {
                    key: k.clone(),
                    value: v.clone(),
                    problem: "\"0:0\" with EnableUseFabricMem=1 (fabric memory has no buffer pool)",
                });
            }
            continue;
        }
        return Err(Error::InvalidOption {
            key: k.clone(),
            value: v.clone(),
            problem: "not an option of a fabric-memory engine (EnableUseFabricMem=1 accepts \
                      Rdma*, LocalCommRes, BufferPool, AutoConnect, GlobalResourceConfig)",
        });
    }
    if let Some(g) = &o.global_resource_config
        && g.fabric_enable_aicpu_unfold == Some(true)
    {
        return Err(Error::UnsupportedOption {
            key: "GlobalResourceConfig".into(),
            value: "fabric_memory.enable_aicpu_unfold=true".into(),
            why: NO_AICPU,
        });
    }
    Ok(())
}
