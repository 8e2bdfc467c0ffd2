package talossim

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
)

// RandomLoopbackPrefix picks a random 127.X.Y.0/24 whose .1 address can
// be bound on port, so parallel test binaries (and labs) that each pick
// one do not collide on apid's fixed port. Linux routes all of 127/8 to
// the loopback interface.
func RandomLoopbackPrefix(port int) (netip.Prefix, error) {
	var last error
	for range 50 {
		a := netip.AddrFrom4([4]byte{127, byte(1 + rand.IntN(254)), byte(rand.IntN(256)), 0})
		probe := a.Next()
		lis, err := net.Listen("tcp", net.JoinHostPort(probe.String(), strconv.Itoa(port)))
		if err != nil {
			last = err
			continue
		}
		lis.Close()
		return netip.PrefixFrom(a, 24), nil
	}
	return netip.Prefix{}, fmt.Errorf("no free 127.X.Y.0/24 for port %d: %w", port, last)
}

// HostAddr is the address with the last octet host in the /24 that
// RandomLoopbackPrefix picked: the nodes of a simulated cluster live there.
func HostAddr(prefix netip.Prefix, host byte) string {
	b := prefix.Addr().As4()
	b[3] = host
	return netip.AddrFrom4(b).String()
}
