// Command dowse-pause is the pod sandbox image of the test node: it does
// nothing until it is told to stop. The CRI needs a sandbox image locally and
// none can be pulled on our machines.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// As PID 1 of the sandbox, the default signal actions do not apply: wait
	// for SIGTERM or SIGINT explicitly and exit cleanly.
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
