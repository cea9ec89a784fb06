//! `sqlx::migrate!` embeds `migrations/` at compile time; without this a migration added since
//! the last build would not be in the binary (sqlx's documented build script).
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
