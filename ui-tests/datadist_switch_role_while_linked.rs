// LLM-DataDist's typed layer: a link borrows its cluster, so `switch_role` (which consumes the
// cluster) does not compile while a link lives.
use hixl::datadist::typed::{Cluster, Decoder, Prompt};
use std::time::Duration;

fn main() {
    let _ = Cluster::<Decoder>::scope(2, &[] as &[(&str, &str)], |decoder| {
        let link = decoder.link(1, "127.0.0.1:26000".parse().unwrap(), Duration::from_secs(1)).unwrap();
        let prompt = decoder.switch_role::<Prompt, &str, &str>(&[]).unwrap(); //~ ERROR E0505
        drop(link);
        prompt.finalize();
    });
}
