// gobench: a small re-creation of etcd's tools/benchmark `put` and `range`
// commands (etcd 3.4), built against the etcd 3.4 clientv3 and pkg/report
// sources that Debian ships in golang-etcd-server-dev. It exists so that
// retcd-bench's drive can be compared with the Go tool's on the same server.
//
// Structure, flags and request loop follow etcd's tools/benchmark/cmd
// (root.go, util.go, put.go, range.go): N clients share M clientv3.Client
// connections (client i uses conn i%M), requests come from one channel of
// clientv3.Op fed by a generator goroutine, each client goroutine does
// c.Do(ctx, op) and sends a report.Result; the report is etcd's pkg/report.
// The only addition: a final "Client CPU" line (getrusage of this process),
// so that the tool's own cost per request can be read off like retcd-bench's.
package main

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"gopkg.in/cheggaaa/pb.v1"
)

var (
	rootCmd = &cobra.Command{
		Use:   "gobench",
		Short: "A low-level benchmark tool for etcd3 (put/range subset of etcd's tools/benchmark)",
	}

	endpoints    []string
	totalConns   uint
	totalClients uint
	precise      bool
	sample       bool
	dialTimeout  time.Duration
	targetLeader bool

	bar *pb.ProgressBar
	wg  sync.WaitGroup
)

func init() {
	rootCmd.PersistentFlags().StringSliceVar(&endpoints, "endpoints", []string{"127.0.0.1:2379"}, "gRPC endpoints")
	rootCmd.PersistentFlags().UintVar(&totalConns, "conns", 1, "Total number of gRPC connections")
	rootCmd.PersistentFlags().UintVar(&totalClients, "clients", 1, "Total number of gRPC clients")
	rootCmd.PersistentFlags().BoolVar(&precise, "precise", false, "use full floating point precision")
	rootCmd.PersistentFlags().BoolVar(&sample, "sample", false, "'true' to sample requests for every second")
	rootCmd.PersistentFlags().DurationVar(&dialTimeout, "dial-timeout", 0, "dial timeout for client connections")
	rootCmd.PersistentFlags().BoolVar(&targetLeader, "target-leader", false, "connect only to the leader node")
}

// printClientCPU prints this process's user+system CPU time since start,
// per request too, on stdout after the report.
func printClientCPU(requests int) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return
	}
	secs := float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	per := 0.0
	if requests > 0 {
		per = secs * 1e6 / float64(requests)
	}
	fmt.Printf("Client CPU: %.3f s (user %.3f s, sys %.3f s), %.1f ms per 1000 requests\n",
		secs, float64(ru.Utime.Nano())/1e9, float64(ru.Stime.Nano())/1e9, per)
}

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
