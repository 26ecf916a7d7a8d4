// Command etcd is the etcd server the test control plane runs, built from the
// module proxy because no prebuilt release can be downloaded on our machines.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
