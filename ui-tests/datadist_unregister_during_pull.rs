// LLM-DataDist's typed layer: a pull borrows the cache it writes (`&Cache`, held for the whole
// call, on this thread or a scoped one), so the cache cannot be unregistered (consumed) while a
// pull holds it.
use hixl::datadist::typed::{Cluster, Decoder, Layout, PeerCache};
use std::time::Duration;

fn main() {
    let _ = Cluster::<Decoder>::scope(2, &[] as &[(&str, &str)], |decoder| {
        let desc = hixl::datadist::CacheDesc {
            placement: hixl::datadist::Placement::Host,
            num_tensors: 1,
            data_type: hixl::datadist::DataType::UINT8,
            shape: vec![4, 1024],
        };
        let kv = vec![hixl::HostBuffer::new(4096).unwrap()];
        let cache = decoder.register_cache(&desc, Layout::Blocks, kv, &[]).unwrap();
        let link = decoder.link(1, "127.0.0.1:26000".parse().unwrap(), Duration::from_secs(1)).unwrap();
        let in_flight = &cache; // what a pull on another thread holds until it returns
        let _kv = cache.unregister(); //~ ERROR E0505
        let _ = link.pull_blocks(PeerCache::Blocks { model_id: 1 }, in_flight, &[0], &[0]);
    });
}
