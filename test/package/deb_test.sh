#!/usr/bin/env bash
# The Debian package: `cpack -G DEB` from the build tree, its contents and control data checked
# with dpkg-deb, lintian errors refused, the systemd unit verified with systemd-analyze, then
# unpacked into a scratch root where the consumer project builds against the installed
# find_package(bitship), a program builds from the pkg-config file alone, and the packaged
# xagent, xctl and consumer run together.
# Usage: deb_test.sh BUILD_DIR SOURCE_DIR          Exit 77 (ctest: skipped) without dpkg-deb.
set -euo pipefail
build=$1 source=$2
command -v dpkg-deb >/dev/null || { echo "SKIP: no dpkg-deb"; exit 77; }
work=$(mktemp -d)
agent=
cleanup() { [[ -n $agent ]] && kill -TERM "$agent" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}

# 1. Build the package.
cpack -G DEB -B "$work/pkg" --config "$build/CPackConfig.cmake" >"$work/cpack.log" 2>&1 || { cat "$work/cpack.log"; exit 1; }
deb=$(ls "$work"/pkg/*.deb)
echo "package: $(basename "$deb"), $(stat -c %s "$deb") bytes"

# 2. What is in it.
dpkg-deb -c "$deb" | awk '{print $6}' >"$work/contents"
for f in ./usr/bin/xagent ./usr/bin/bitship-compiler ./usr/bin/xctl ./usr/bin/bitship-bundle ./usr/include/bitship/client.hpp \
         ./usr/include/bitship/kernel.h ./usr/include/bitship/peers.hpp ./usr/lib/libbitship_core.a \
         ./usr/lib/cmake/bitship/bitshipConfig.cmake ./usr/lib/cmake/bitship/BitshipKernels.cmake \
         ./usr/lib/pkgconfig/bitship.pc ./lib/systemd/system/xagent.service ./etc/bitship/xagent.toml \
         ./usr/share/doc/bitship/copyright ./usr/share/doc/bitship/changelog.gz; do
  grep -qx "$f" "$work/contents" || { echo "the package lacks $f"; cat "$work/contents"; exit 1; }
done
[[ $(dpkg-deb -f "$deb" Package) == bitship ]] || { echo "package name is not bitship"; exit 1; }
dpkg-deb -f "$deb" Depends | grep -q libucx || { echo "Depends does not name UCX"; exit 1; }
dpkg-deb -e "$deb" "$work/control"
grep -qx /etc/bitship/xagent.toml "$work/control/conffiles" || { echo "the config file is not a conffile"; exit 1; }
echo "contents, control fields and conffiles: as expected"

# 3. lintian, where installed: no errors (warnings are printed).
if command -v lintian >/dev/null; then
  lintian --tag-display-limit 0 "$deb" 2>/dev/null | tee "$work/lintian.txt" || true
  if grep -q '^E:' "$work/lintian.txt"; then echo "lintian reports errors"; exit 1; fi
  echo "lintian: no errors"
else
  echo "lintian not installed: that check skipped"
fi

# 4. Unpack into a scratch root; verify the unit there (systemd's own units copied in, so
#    its dependencies resolve inside the root, and its ExecStart is the packaged binary).
root=$work/root
dpkg -x "$deb" "$root"
if command -v systemd-analyze >/dev/null; then
  mkdir -p "$root/tmp"
  cp -rn /lib/systemd/system/. "$root/lib/systemd/system/"
  systemd-analyze verify --root="$root" /lib/systemd/system/xagent.service
  # A control: the same check must fail a unit whose binary is missing.
  sed 's|ExecStart=/usr/bin/xagent|ExecStart=/usr/bin/no-such-xagent|' "$root/lib/systemd/system/xagent.service" \
    >"$root/lib/systemd/system/broken-xagent.service"
  if systemd-analyze verify --root="$root" /lib/systemd/system/broken-xagent.service 2>/dev/null; then
    echo "systemd-analyze verify passed a unit with a missing binary: it checks nothing here"; exit 1
  fi
  echo "systemd-analyze verify: xagent.service is valid"
else
  echo "systemd-analyze not installed: that check skipped"
fi
# The packaged config file is one the packaged xagent accepts.
"$root/usr/bin/xagent" --config "$root/etc/bitship/xagent.toml" --help >/dev/null

# 5. The installed CMake package builds the consumer project.
cmake -S "$source/test/package/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$root/usr" >/dev/null
cmake --build "$work/consumer" >/dev/null
if ldd "$work/consumer/app" | grep -qi llvm; then echo "the client links LLVM"; exit 1; fi

# 6. The pkg-config file alone builds a client.
cat >"$work/pc_client.cpp" <<'CPP'
#include <bitship/client.hpp>
#include <cstdio>
int main() {
    auto c = bitship::Client::create();
    std::puts(c ? "client created" : c.error().describe().c_str());
    return c ? 0 : 1;
}
CPP
pc_flags=$(PKG_CONFIG_PATH="$root/usr/lib/pkgconfig" pkg-config --cflags --libs --static bitship)
[[ $pc_flags == *"-I$root/usr/lib/pkgconfig/../../include"* ]] || { echo "pkg-config does not point into the unpacked root: $pc_flags"; exit 1; }
c++ -std=c++20 "$work/pc_client.cpp" -o "$work/pc_client" $pc_flags
UCX_NET_DEVICES=lo "$work/pc_client"

# 7. The packaged xagent serves the consumer and answers the packaged xctl.
"$root/usr/bin/xagent" --listen 127.0.0.1:0 --port-file "$work/port" --loopback --log-level warn &
agent=$!
for _ in $(seq 200); do [[ -s $work/port ]] && break; sleep 0.05; done
"$work/consumer/app" "127.0.0.1:$(cat "$work/port")"
"$root/usr/bin/xctl" --agent "127.0.0.1:$(cat "$work/port")" --loopback ping --count 2
echo "the .deb: contents, lintian, unit, find_package, pkg-config and the packaged programs all hold"
