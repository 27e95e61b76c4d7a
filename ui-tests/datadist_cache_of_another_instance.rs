// LLM-DataDist's typed layer: each instance brands its caches and links with a lifetime of its
// own scope, so a cache of one instance given to another instance's link does not compile.
use hixl::datadist::typed::{Cluster, Decoder, Layout, PeerCache, Prompt};
use std::time::Duration;

fn main() {
    let desc = hixl::datadist::CacheDesc {
        placement: hixl::datadist::Placement::Host,
        num_tensors: 1,
        data_type: hixl::datadist::DataType::UINT8,
        shape: vec![4, 1024],
    };
    let _ = Cluster::<Prompt>::scope(1, &[] as &[(&str, &str)], |prompt| {
        let kv = vec![hixl::HostBuffer::new(4096).unwrap()];
        let prompt_cache = prompt.register_cache(&desc, Layout::Blocks, kv, &[]).unwrap();
        let _ = Cluster::<Decoder>::scope(2, &[] as &[(&str, &str)], |decoder| {
            let link = decoder.link(3, "127.0.0.1:26000".parse().unwrap(), Duration::from_secs(1)).unwrap();
            let _ = link.pull_blocks(PeerCache::Blocks { model_id: 1 }, &prompt_cache, &[0], &[0]); //~ ERROR E0521
        });
    });
}
