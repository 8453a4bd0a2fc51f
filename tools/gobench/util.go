package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/pkg/report"
	"google.golang.org/grpc/grpclog"
)

var (
	// dialTotal counts mustCreateConn calls, so that connections are spread
	// over the endpoints round-robin (as etcd's benchmark does).
	dialTotal int
	// leaderEps caches the leader's client URLs for --target-leader.
	leaderEps []string
)

func mustFindLeaderEndpoints(c *clientv3.Client) {
	resp, err := c.MemberList(context.TODO())
	if err != nil {
		fmt.Fprintf(os.Stderr, "failed to get a member list: %s\n", err)
		os.Exit(1)
	}
	leaderID := uint64(0)
	for _, ep := range c.Endpoints() {
		if sresp, serr := c.Status(context.TODO(), ep); serr == nil {
			leaderID = sresp.Leader
			break
		}
	}
	for _, m := range resp.Members {
		if m.ID == leaderID {
			leaderEps = m.ClientURLs
			return
		}
	}
	fmt.Fprintf(os.Stderr, "failed to find a leader endpoint\n")
	os.Exit(1)
}

// mustCreateConn makes one clientv3.Client (= one gRPC connection).
func mustCreateConn() *clientv3.Client {
	connEndpoints := leaderEps
	if len(connEndpoints) == 0 {
		connEndpoints = []string{endpoints[dialTotal%len(endpoints)]}
		dialTotal++
	}
	cfg := clientv3.Config{Endpoints: connEndpoints, DialTimeout: dialTimeout}
	client, err := clientv3.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "dial error: %v\n", err)
		os.Exit(1)
	}
	if targetLeader && len(leaderEps) == 0 {
		mustFindLeaderEndpoints(client)
		client.Close()
		return mustCreateConn()
	}
	clientv3.SetLogger(grpclog.NewLoggerV2(os.Stderr, os.Stderr, os.Stderr))
	return client
}

// mustCreateClients: totalConns connections, client i uses conn i%totalConns.
func mustCreateClients(totalClients, totalConns uint) []*clientv3.Client {
	conns := make([]*clientv3.Client, totalConns)
	for i := range conns {
		conns[i] = mustCreateConn()
	}
	clients := make([]*clientv3.Client, totalClients)
	for i := range clients {
		clients[i] = conns[i%int(totalConns)]
	}
	return clients
}

func mustRandBytes(n int) []byte {
	rb := make([]byte, n)
	if _, err := rand.Read(rb); err != nil {
		fmt.Fprintf(os.Stderr, "failed to generate value: %v\n", err)
		os.Exit(1)
	}
	return rb
}

func newReport() report.Report {
	p := "%4.4f"
	if precise {
		p = "%g"
	}
	if sample {
		return report.NewReportSample(p)
	}
	return report.NewReport(p)
}
