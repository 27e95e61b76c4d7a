// LLM-DataDist's typed layer: a link borrows its cluster, so the cluster cannot be finalized
// while a link lives.
use hixl::datadist::typed::{Cluster, Decoder};
use std::time::Duration;

fn main() {
    let _ = Cluster::<Decoder>::scope(2, &[] as &[(&str, &str)], |decoder| {
        let link = decoder.link(1, "127.0.0.1:26000".parse().unwrap(), Duration::from_secs(1)).unwrap();
        decoder.finalize(); //~ ERROR E0505
        drop(link);
    });
}
