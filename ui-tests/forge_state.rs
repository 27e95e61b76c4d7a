// The state markers are sealed: no other crate can add a state (or forge an engine in one).
#[derive(Debug)]
struct Hacked;

impl hixl::State for Hacked { //~ ERROR E0277
    const NAME: &'static str = "Hacked";
}

fn main() {}
