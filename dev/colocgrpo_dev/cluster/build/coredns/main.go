// CoreDNS for the dev cluster's real node, with only the plugins its Corefile uses
// (dev/colocgrpo_dev/cluster/node/dns.py). CoreDNS as a library: importing a plugin
// registers it, and coremain.Run is CoreDNS's own main. Leaving out the rest (cloud DNS
// providers, forward, etcd, ...) keeps the build to the module's core and client-go; no
// plugin that could send a query off this machine is in the binary.
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
