// LLM-DataDist's typed layer: nothing branded with an instance's lifetime leaves its scope (the
// instance is finalized when the scope ends), so returning a cache from it does not compile.
use hixl::datadist::typed::{Cluster, Decoder, Layout};

fn main() {
    let cache = Cluster::<Decoder>::scope(2, &[] as &[(&str, &str)], |decoder| {
        let desc = hixl::datadist::CacheDesc {
            placement: hixl::datadist::Placement::Host,
            num_tensors: 1,
            data_type: hixl::datadist::DataType::UINT8,
            shape: vec![4, 1024],
        };
        let kv = vec![hixl::HostBuffer::new(4096).unwrap()];
        decoder.register_cache(&desc, Layout::Blocks, kv, &[]).unwrap() //~ ERROR lifetime
    });
    drop(cache);
}
