#!/usr/bin/env bash
# Builds the jar a user adds to a Flink job (release library, no test-only
# fail points), publishes it to the local Maven repository, and checks what
# it holds: our classes and the native library, not Flink, not fail points.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh

gradle --no-daemon -q jar publishToMavenLocal -PcargoTargetDir="$PWD/target"
jar=$(ls build/libs/twopc-flink-*.jar | head -n 1)
listing=$(unzip -l "$jar")
fail() { say "jar check failed: $*"; exit 1; }
grep -q 'native/linux-x86_64/libtwopc_jni.so' <<<"$listing" || fail "$jar has no native/linux-x86_64/libtwopc_jni.so"
for class in TwopcSink TwopcSinkFunction TwopcWriter TwopcCommitter; do
    grep -q "io/twopc/flink/$class.class" <<<"$listing" || fail "$jar has no io/twopc/flink/$class.class"
done
for class in table/TwopcDynamicTableSinkFactory table/TwopcDynamicTableSink; do
    grep -q "io/twopc/flink/$class.class" <<<"$listing" || fail "$jar has no io/twopc/flink/$class.class"
done
# The SQL connector is found through this service file ('connector' = 'twopc').
unzip -p "$jar" META-INF/services/org.apache.flink.table.factories.Factory 2>/dev/null \
    | grep -qx 'io.twopc.flink.table.TwopcDynamicTableSinkFactory' \
    || fail "$jar does not register io.twopc.flink.table.TwopcDynamicTableSinkFactory in META-INF/services/org.apache.flink.table.factories.Factory"
if grep -q 'org/apache/flink/' <<<"$listing"; then fail "$jar bundles Flink classes (Flink must stay compileOnly)"; fi
lib=$(mktemp)
unzip -p "$jar" native/linux-x86_64/libtwopc_jni.so >"$lib"
if grep -a -q 'twopc-commit-after' "$lib"; then rm -f "$lib"; fail "the jar's native library was built with test-only fail points"; fi
rm -f "$lib"
version=$(sed -n "s/^version = '\(.*\)'/\1/p" build.gradle)
pom="$HOME/.m2/repository/io/twopc/twopc-flink/$version/twopc-flink-$version.pom"
[ -f "$pom" ] || fail "no POM published at $pom"
grep -q '<artifactId>twopc-flink</artifactId>' "$pom" || fail "$pom does not name artifact twopc-flink"
say "jar ok: $jar ($(wc -c <"$jar") bytes), published as io.twopc:twopc-flink:$version"
