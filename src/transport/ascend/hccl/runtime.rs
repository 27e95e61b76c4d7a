//! An engine's HCCL runtime ([`Runtime`]): its device (the device floor's [`Device`]: ACL
//! loaded once per process, the device taken on the initializing thread, and that thread's
//! context), HCCL, and what the HCCL data path needs to know of the device (the SoC family,
//! A3's super-pod ids, the device IP); what `hixl::probe()` says of CANN.

use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use super::{CommConfig, GlobalMem, Hccl, MemKind};
use crate::device::Device;
use crate::device::acl::{
    ACL_DEV_ATTR_SUPER_POD_DEVICE_ID, ACL_DEV_ATTR_SUPER_POD_ID, Acl, ContextGuard,
};
use crate::error::Error;
use crate::transport::ascend::options::AscendOptions;
use crate::types::MemType;

/// The SoC families the backend tells apart, by `aclrtGetSocName` (HIXL's `SocType` lists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Soc {
    /// Atlas A2 (`Ascend910B1`..`B4`, `B2C`, `B4-1`): rank table 1.0.
    A2,
    /// Atlas A3 (`Ascend910_9391`, `_9381`, `_9392`, `_9382`, `_9372`, `_9362`): rank table 1.2
    /// with super-device ids (HCCS between the servers of a super pod).
    A3,
    /// Ascend950 (A5): HCCL's V2 one-sided path takes at most 64 descriptors per batch call.
    A5,
    /// Anything else (or no name): treated like A2.
    Other,
}

/// The SoC names HIXL treats as A2 (`kSocV2`).
const SOC_A2: &[&str] = &[
    "Ascend910B1",
    "Ascend910B2",
    "Ascend910B3",
    "Ascend910B4",
    "Ascend910B2C",
    "Ascend910B4-1",
];
/// The SoC names HIXL treats as A3 (`kSocV3`, and `LocalCommResGenerator`'s rank table 1.2 set).
const SOC_A3: &[&str] = &[
    "Ascend910_9391",
    "Ascend910_9381",
    "Ascend910_9392",
    "Ascend910_9382",
    "Ascend910_9372",
    "Ascend910_9362",
];

impl Soc {
    /// The family of an `aclrtGetSocName` result.
    pub(crate) fn from_name(name: &str) -> Self {
        if SOC_A3.contains(&name) {
            Self::A3
        } else if SOC_A2.contains(&name) {
            Self::A2
        } else if name.contains("Ascend950") {
            Self::A5
        } else {
            Self::Other
        }
    }

    /// The rank-table version the backend generates on this SoC.
    pub(crate) fn rank_table_version(self) -> &'static str {
        match self {
            Self::A3 => "1.2",
            _ => "1.0",
        }
    }

    /// Most descriptors per `HcclBatchPut`/`HcclBatchGet` call.
    pub(crate) fn max_descs_per_call(self) -> usize {
        match self {
            Self::A5 => super::MAX_DESCS_PER_CALL_V2,
            _ => super::MAX_DESCS_PER_CALL,
        }
    }
}

/// An A3 device's place in its super pod (`aclrtGetDeviceInfo`), for rank table 1.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SuperIds {
    /// `ACL_DEV_ATTR_SUPER_POD_DEVICE_ID`: the rank table's `super_device_id`.
    pub(crate) device: i64,
    /// `ACL_DEV_ATTR_SUPER_POD_ID`: the `super_pod_list` entry's `super_pod_id`.
    pub(crate) pod: i64,
}

/// Why device memory is refused on an engine that found no CANN.
pub(crate) const NO_CANN: &str = "device memory needs CANN's ACL runtime and HCCL (libacl_rt.so \
     or libascendcl.so, libhcomm.so or libhccl.so, through the loader path CANN's set_env.sh sets \
     or $ASCEND_HOME_PATH/lib64), which did not load";

/// An engine's Ascend runtime: its device (ACL, the device and the initializing thread's
/// context: the device leaf), HCCL, and what the HCCL data path needs to know of the device.
pub(crate) struct Runtime {
    pub(crate) device: Arc<Device>,
    pub(crate) hccl: Hccl,
    pub(crate) device_ip: Option<IpAddr>,
    pub(crate) soc: Soc,
    pub(crate) super_ids: Option<SuperIds>,
    pub(crate) comm: CommConfig,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("device", &self.device)
            .field("hccl", &self.hccl.library())
            .field("device_ip", &self.device_ip)
            .field("super_ids", &self.super_ids)
            .finish()
    }
}

impl Runtime {
    /// Loads ACL and HCCL and takes the device of the calling thread, whose context becomes the
    /// engine's (HIXL `Initialize`, [`Device::open`]: `hixl.ascend.device_id` when given, else
    /// the device `aclrtGetDevice` reports, else device 0). Then asks ACL, on A3, for the
    /// super-pod ids, and finds the device IP.
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] (`UNSUPPORTED`) for a missing library or symbol;
    /// [`Error::InvalidOption`] for a device id of 2^31 or more; [`Error::Native`] from ACL.
    pub(crate) fn start(o: &AscendOptions) -> Result<Arc<Self>, Error> {
        let acl = Acl::load(o.acl_lib.as_deref())?;
        let hccl = Hccl::load(o.hccl_lib.as_deref())?;
        Self::start_with(acl, hccl, o)
    }

    /// [`Runtime::start`] where CANN loads ([`AscendMode::Auto`](crate::AscendMode::Auto)):
    /// `Ok(Err(why))` when ACL or HCCL does not load (the engine is then host-only).
    ///
    /// # Errors
    /// As [`Runtime::start`], once both libraries loaded.
    pub(crate) fn start_if_installed(
        o: &AscendOptions,
    ) -> Result<Result<Arc<Self>, &'static str>, Error> {
        let loaded = Acl::load(o.acl_lib.as_deref())
            .and_then(|acl| Ok((acl, Hccl::load(o.hccl_lib.as_deref())?)));
        match loaded {
            Ok((acl, hccl)) => Self::start_with(acl, hccl, o).map(Ok),
            Err(e) => {
                tracing::debug!(error = %e, "CANN does not load: the engine moves host memory only");
                Ok(Err(NO_CANN))
            }
        }
    }

    fn start_with(acl: Acl, hccl: Hccl, o: &AscendOptions) -> Result<Arc<Self>, Error> {
        let device = Device::open(acl, o.device_id, o.require_device)?;
        let soc = Soc::from_name(&device.soc_name);
        let super_ids = match soc {
            Soc::A3 => Some(SuperIds {
                device: device
                    .acl
                    .device_info(device.device_id, ACL_DEV_ATTR_SUPER_POD_DEVICE_ID)?,
                pod: device
                    .acl
                    .device_info(device.device_id, ACL_DEV_ATTR_SUPER_POD_ID)?,
            }),
            _ => None,
        };
        let (device_id, phy_id) = (device.device_id, device.phy_id);
        let device_ip = o.resolve_device_ip(phy_id);
        if device_ip.is_none() {
            tracing::warn!(
                device_id,
                phy_id,
                "no device IP (hixl.ascend.device_ip, or address_{phy_id} / IPv6address_{phy_id} \
                 in /etc/hccn.conf): only links within this server or this A3 super pod will work"
            );
        }
        Ok(Arc::new(Self {
            device: Arc::new(device),
            hccl,
            device_ip,
            soc,
            super_ids,
            comm: CommConfig {
                traffic_class: o.rdma_traffic_class,
                service_level: o.rdma_service_level,
                ..CommConfig::default()
            },
        }))
    }

    /// Makes the engine's context current on this thread until the guard drops.
    ///
    /// # Errors
    /// [`Error::Native`] from `aclrtSetCurrentContext`.
    pub(crate) fn enter(&self) -> Result<ContextGuard, Error> {
        self.device.enter()
    }

    /// The loaded ACL runtime.
    pub(crate) fn acl(&self) -> &Acl {
        &self.device.acl
    }

    /// `HcclRegisterGlobalMem` for a region about to be registered with the engine.
    ///
    /// # Safety
    /// `addr..addr + len` is memory of `mem_type` that stays allocated until the returned
    /// registration is dropped, and no Rust reference to it is live while peers may write it.
    pub(crate) unsafe fn register(
        &self,
        addr: usize,
        len: usize,
        mem_type: MemType,
    ) -> Result<GlobalMem, Error> {
        let _guard = self.enter()?;
        let kind = match mem_type {
            MemType::Device => MemKind::Device,
            MemType::Host => MemKind::Host,
        };
        // SAFETY: forwarded from the caller.
        unsafe { self.hccl.register_global_mem(kind, addr, len as u64) }
    }
}

static PROBE: OnceLock<Result<String, String>> = OnceLock::new();

/// What [`probe`] reports for loaded libraries: their names, the SoC (`aclrtGetSocName`, which
/// needs no initialisation) and what the backend chooses for it.
pub(crate) fn describe(acl: &Acl, hccl: &Hccl) -> String {
    let (name, soc) = match acl.soc_name() {
        Some(n) => {
            let soc = Soc::from_name(&n);
            (n, soc)
        }
        None => (
            "unknown (aclrtGetSocName returned nothing)".to_owned(),
            Soc::Other,
        ),
    };
    format!(
        "ACL runtime {} and HCCL {}; SoC {name} ({soc:?}): rank table {}, at most {} descriptors \
         per HCCL batch call (verified against an ABI test double; not yet run on Ascend \
         hardware)",
        acl.library(),
        hccl.library(),
        soc.rank_table_version(),
        soc.max_descs_per_call(),
    )
}

/// Whether the default ACL and HCCL libraries (or `$HIXL_ACL_LIB` / `$HIXL_HCCL_LIB`) load,
/// with every symbol, and which SoC they report; checked once per process (nothing is
/// initialised).
pub(crate) fn probe() -> Result<&'static str, &'static str> {
    let r = PROBE.get_or_init(|| {
        let acl = Acl::load(None).map_err(|e| e.to_string())?;
        let hccl = Hccl::load(None).map_err(|e| e.to_string())?;
        Ok(describe(&acl, &hccl))
    });
    match r {
        Ok(s) => Ok(s.as_str()),
        Err(s) => Err(s.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::acl::tests::Fixture;
    use crate::device::double;

    #[test]
    fn socs_choose_the_rank_table_and_the_batch_limit() {
        assert_eq!(Soc::from_name("Ascend910B4-1"), Soc::A2);
        for a3 in SOC_A3 {
            assert_eq!(Soc::from_name(a3), Soc::A3);
        }
        assert_eq!(Soc::from_name("Ascend910_9391"), Soc::A3);
        assert_eq!(Soc::from_name("Ascend950PR_9599"), Soc::A5);
        assert_eq!(Soc::from_name("Ascend310P3"), Soc::Other);
        assert_eq!(Soc::from_name(""), Soc::Other);
        assert_eq!(Soc::A3.rank_table_version(), "1.2");
        assert_eq!(Soc::A2.rank_table_version(), "1.0");
        assert_eq!(Soc::A5.rank_table_version(), "1.0");
        assert_eq!(Soc::A5.max_descs_per_call(), 64);
        assert_eq!(Soc::A2.max_descs_per_call(), 256);
    }

    /// What `hixl::probe()` says when the libraries load: the SoC and the rank-table version.
    #[test]
    fn probe_reports_the_soc_and_the_rank_table_version() {
        let f = Fixture::new("probe");
        let hccl = Hccl::load(Some(&f.so)).unwrap();
        let d = describe(&f.acl, &hccl);
        assert!(
            d.contains("SoC Ascend910B1 (A2): rank table 1.0, at most 256 descriptors"),
            "{d}"
        );
        assert!(d.contains("not yet run on Ascend hardware"), "{d}");
        double::control(&f.so, "soc", Some("Ascend910_9392"));
        let d = describe(&f.acl, &hccl);
        assert!(d.contains("SoC Ascend910_9392 (A3): rank table 1.2"), "{d}");
        double::control(&f.so, "soc", Some("Ascend950PR_9599"));
        let d = describe(&f.acl, &hccl);
        assert!(
            d.contains("(A5): rank table 1.0, at most 64 descriptors"),
            "{d}"
        );
    }

    /// ACL is opened once per process, and HCCL too: however often and from wherever they are
    /// loaded (the device, an HCCL engine's runtime, a fabric engine's, fabric memory, the
    /// probe's description), one `dlopen` each, one table each.
    #[test]
    fn acl_and_hccl_are_opened_once_per_process() {
        let f = Fixture::new("opened-once");
        let name = f.so.to_string_lossy().into_owned();
        let o = AscendOptions {
            acl_lib: Some(f.so.clone()),
            hccl_lib: Some(f.so.clone()),
            device_id: Some(0),
            ..AscendOptions::default()
        };
        let rt = Runtime::start(&o).expect("an HCCL engine's runtime");
        assert!(rt.acl().same_table(&f.acl), "the fixture's table");
        let again = Acl::load(Some(&f.so)).unwrap();
        assert!(again.same_table(&f.acl));
        let fabric = crate::transport::ascend::fabric::FabricRt::start(&o).expect("fabric");
        assert!(fabric.device.acl.same_table(&f.acl));
        let buf = crate::device::bind(7, Some(&fabric.device), |tok| {
            crate::device::DeviceMem::alloc(
                &fabric.device,
                7,
                tok,
                4096,
                crate::device::Alloc::Fabric(MemType::Device),
            )
            .map(crate::device::FabricBuffer::from)
        })
        .unwrap()
        .expect("fabric memory");
        let hccl = Hccl::load(Some(&f.so)).unwrap();
        assert!(
            describe(&again, &hccl).contains(&name),
            "the probe's description"
        );
        drop(buf);
        assert_eq!(Acl::opened(&name), 1, "ACL opened once");
        assert_eq!(Hccl::opened(&name), 1, "HCCL opened once");
    }
}
