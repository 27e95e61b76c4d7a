// LLM-DataDist's typed layer: pulls and pushes exist only on a linked cluster
// (`LinkedCluster`), so a pull on the instance itself does not compile.
use hixl::datadist::typed::{Cluster, Decoder, Layout, PeerCache};

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
        decoder.pull_blocks(PeerCache::Blocks { model_id: 1 }, &cache, &[0], &[0]); //~ ERROR E0599
    });
}
