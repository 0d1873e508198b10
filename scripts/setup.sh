# Shared set-up for the README commands: checks for each tool the project
# needs and installs what Debian's packages provide when running as root.
# Sourced, not run.

say() { printf '[twopc] %s\n' "$*" >&2; }

need_root_or_explain() {
    # $1: package list, $2: what it is for
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        return 0
    fi
    say "missing: $2. Install it with: sudo apt-get install -y $1"
    exit 3
}

apt_install() {
    # apt-get update once per run, then install the given packages.
    if [ -z "${TWOPC_APT_UPDATED:-}" ]; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        TWOPC_APT_UPDATED=1
    fi
    say "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        say "missing: Rust (cargo). Install it from https://rustup.rs (rustup default stable), then run this again."
        exit 3
    fi
    for component in rustfmt clippy; do
        if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
            if command -v rustup >/dev/null 2>&1; then
                rustup component add "$component"
            else
                say "missing: cargo $component. Install it with: rustup component add $component"
                exit 3
            fi
        fi
    done
}

ensure_java() {
    if ! command -v java >/dev/null 2>&1 || ! command -v javac >/dev/null 2>&1; then
        need_root_or_explain openjdk-17-jdk-headless "a JDK (17 or newer)"
        apt_install openjdk-17-jdk-headless
    fi
}

ensure_gradle() {
    if ! command -v gradle >/dev/null 2>&1; then
        need_root_or_explain gradle "Gradle (Debian's package is enough)"
        apt_install gradle
    fi
}
