// LLM-DataDist's typed layer: the roles are sealed; no other crate can add one.
use hixl::datadist::Role;

#[derive(Debug)]
struct Hacked;

impl hixl::datadist::typed::RoleState for Hacked { //~ ERROR E0277
    const ROLE: Role = Role::Mix;
}

fn main() {}
